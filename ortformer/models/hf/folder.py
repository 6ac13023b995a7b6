"""Reading a local Hugging Face / sentence-transformers folder: JSON configs, the
module layout, pooling and prompts. Family-specific weight mapping lives beside
this file (one module per family).

sentence-transformers configs, when present, set the pooling: ``modules.json``
lists the modules, ``1_Pooling/config.json`` picks the mode, a ``Dense`` module after
the pooling maps the pooled vector (s = act(W p + b), e.g. LaBSE, distiluse; several linear
ones in a row are multiplied out into one, EmbeddingGemma), and a
``Normalize`` module means l2-normalised embeddings. A sparse encoder's ``SpladePooling``
module pools the masked-LM head's logits into vocabulary weights (SPLADE).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import logging
from typing import Callable

import torch

from ...config import SPLADE_ACTIVATIONS, SPLADE_POOLINGS, EncoderConfig
from ...checks import brief
from ...errors import CheckpointError, ConfigError
from ..loaded import Loaded
from ..weights import Tensors, check_tensors, encoder_from_tensors, find_weights, read_weights, weights_source
from .heads import classifier_head, mlm_head, mlm_inputs

log = logging.getLogger(__name__)
MapWeights = Callable[[Tensors, EncoderConfig, str, list], tuple[Tensors, list[str]]]

TOKENIZER_NAME = "tokenizer.json"
HF_WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin")
ST_SUPPORTED = {"Transformer", "MLMTransformer", "Pooling", "SpladePooling", "Dense", "Normalize"}
# sentence-transformers' Dense activation_function (a torch.nn class path) -> config name;
# the module's default when the key is absent is Tanh
ST_DENSE_ACTIVATIONS = {"Tanh": "tanh", "Identity": "identity", "ReLU": "relu", "GELU": "gelu", "Sigmoid": "sigmoid"}
ST_DENSE_WEIGHTS = {"linear.weight": "sentence_dense.weight", "linear.bias": "sentence_dense.bias"}
# half-precision folders are common; upcasting them to float32 is exact
HF_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)  # float64: cast to float32


def read_json(path: Path, kind: type = dict):
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nesting bombs
        raise CheckpointError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, kind):
        raise CheckpointError(f"{path} must hold a JSON {kind.__name__}, got {type(data).__name__}")
    return data


def _modules(folder: Path) -> list[dict]:
    """sentence-transformers' modules.json entries, [] when there is none."""
    path = folder / "modules.json"
    if not path.is_file():
        return []
    modules = read_json(path, list)
    if not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(f"{path} must be a list of module objects")
    return modules


def _module_dir(folder: Path, module: dict) -> Path:
    """A module's folder; modules.json may only point inside the model folder."""
    rel = Path(str(module.get("path", "")))
    if rel.is_absolute() or ".." in rel.parts:
        raise CheckpointError(f"modules.json path {str(rel)!r} leaves the model folder {folder}")
    return folder / rel


def transformer_dir(folder: Path) -> Path:
    """The folder holding config.json: the root, or the Transformer module's path in modules.json
    when the root has no Hugging Face config (none, or sentence-transformers < 2's root config.json,
    which holds only {"__version__": ...} beside 0_Transformer/)."""
    root_config = folder / "config.json"
    if not root_config.is_file() or ((folder / "modules.json").is_file() and "model_type" not in read_json(root_config)):
        for module in _modules(folder):
            if _module_kind(module) in ("Transformer", "MLMTransformer"):
                return _module_dir(folder, module)
    return folder


def is_hf_folder(path) -> bool:
    """True when ``path`` is a folder whose config.json is a Hugging Face config (has model_type)."""
    path = Path(path)
    try:
        config = transformer_dir(path) / "config.json"
        return config.is_file() and "model_type" in read_json(config)
    except CheckpointError:
        return False


@dataclass(frozen=True)
class SentenceConfig:
    """What a sentence-transformers layout says about turning token states into one vector."""

    pooling: str | None = None  # None: the folder has no Pooling module
    normalize: bool = False
    max_seq_length: int | None = None
    lowercase: bool = False  # do_lower_case: the Transformer module lowercases texts before tokenizing
    prompts: dict[str, str] = field(default_factory=dict)  # name -> text prepended before tokenizing
    default_prompt: str | None = None  # used when the caller names no prompt
    dense: DenseHead | None = None  # the Dense modules after the pooling
    splade_activation: str = "relu"  # a SpladePooling module's activation_function
    truncate_dim: int | None = None  # config_sentence_transformers.json's truncate_dim (Matryoshka)


@dataclass(frozen=True)
class DenseLayer:
    """One sentence-transformers Dense module: s = act(W p + b), W (out_features, in_features)."""

    folder: Path
    in_features: int
    out_features: int
    activation: str  # a config.DENSE_ACTIVATIONS name
    bias: bool


@dataclass(frozen=True)
class DenseHead:
    """The Dense modules after the pooling, k >= 1 of them. Every one but the last is linear
    (Identity), so s = act(W_k (... (W_1 p + b_1) ...) + b_k) = act(W p + b) with
    W = W_k ... W_1 and b = W_k (... b_1 ...) + b_k: one Dense head (EmbeddingGemma's two)."""

    layers: tuple[DenseLayer, ...]

    def fields(self) -> dict:
        """Its EncoderConfig fields."""
        return {"sentence_dense_size": self.layers[-1].out_features,
                "sentence_dense_activation": self.layers[-1].activation,
                "sentence_dense_bias": any(layer.bias for layer in self.layers)}


def read_sentence_config(folder: Path) -> SentenceConfig:
    """Pooling, Normalize, max_seq_length and prompts from sentence-transformers configs."""
    prompts, default, truncate_dim = read_st_model_config(folder)
    modules = _modules(folder)
    st_config = _transformer_settings(folder)
    if not modules:  # a plain transformers folder: its tokenizer's model_max_length still truncates
        max_len, lowercase = _text_settings(folder, *st_config)
        return SentenceConfig(max_seq_length=max_len, lowercase=lowercase, prompts=prompts, default_prompt=default,
                              truncate_dim=truncate_dim)
    kinds = [_module_kind(m) for m in modules]
    unsupported = [k for k in kinds if k not in ST_SUPPORTED]
    if unsupported:
        raise CheckpointError(
            f"{folder / 'modules.json'} uses sentence-transformers modules ortformer does not implement: "
            f"{', '.join(unsupported)}; supported: {', '.join(sorted(ST_SUPPORTED))}"
        )
    _check_module_order(folder, kinds)
    _check_transformer_task(folder, kinds, st_config[1])
    pooling, dense, splade_activation = None, [], "relu"
    for module, kind in zip(modules, kinds):
        if kind == "Pooling":
            pooling = _pooling_mode(read_json(_module_dir(folder, module) / "config.json"))
        elif kind == "SpladePooling":
            pooling, splade_activation = _splade_mode(_module_dir(folder, module) / "config.json")
        elif kind == "Dense":
            dense.append(_dense_layer(_module_dir(folder, module)))
    max_len, lowercase = _text_settings(folder, *st_config)
    return SentenceConfig(pooling, "Normalize" in kinds, max_len, lowercase, prompts, default,
                          _chain(dense), splade_activation, truncate_dim)


def _check_transformer_task(folder: Path, kinds: list[str], settings: dict) -> None:
    """A fill-mask Transformer (or the older MLMTransformer) hands its modules vocabulary logits,
    which ortformer pools only with SpladePooling; SpladePooling pools nothing else.
    settings: the Transformer module's sentence_bert_config.json."""
    task = "fill-mask" if "MLMTransformer" in kinds else settings.get("transformer_task")
    if (task == "fill-mask") != ("SpladePooling" in kinds):
        raise CheckpointError(
            f"{folder / 'modules.json'}: modules {kinds} with transformer_task={task!r}; ortformer pools a "
            "fill-mask model's vocabulary logits with SpladePooling only, and SpladePooling only those")


def _splade_mode(path: Path) -> tuple[str, str]:
    """(pooling, splade_activation) of a SpladePooling module's config.json."""
    config = read_json(path) if path.is_file() else {}
    strategy, activation = config.get("pooling_strategy", "max"), config.get("activation_function", "relu")
    if f"splade_{strategy}" not in SPLADE_POOLINGS:
        raise CheckpointError(f"{path}: pooling_strategy={strategy!r} is not supported; valid: 'max', 'sum'")
    if activation not in SPLADE_ACTIVATIONS:
        raise CheckpointError(f"{path}: activation_function={activation!r} is not supported; "
                              f"valid: {', '.join(map(repr, SPLADE_ACTIVATIONS))}")
    return f"splade_{strategy}", activation


def _transformer_settings(folder: Path) -> tuple[Path | None, dict]:
    """(path, contents) of the Transformer module's sentence_bert_config.json, in the module's
    folder only, as sentence-transformers reads it; (None, {}) without one."""
    st_config = transformer_dir(folder) / "sentence_bert_config.json"
    return (st_config, read_json(st_config)) if st_config.is_file() else (None, {})


def _text_settings(folder: Path, st_config: Path | None, settings: dict) -> tuple[int | None, bool]:
    """(max_seq_length, do_lower_case) as sentence-transformers' Transformer module reads them.

    Its sentence_bert_config.json (``st_config``, read as ``settings``) holds both; without a
    max_seq_length (sentence-transformers >= 6 saves none) the tokenizer_config.json's
    model_max_length applies."""
    module = transformer_dir(folder)
    max_len, lowercase = settings.get("max_seq_length"), settings.get("do_lower_case", False)
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
        raise CheckpointError(f"{st_config}: max_seq_length={max_len!r} must be a positive int")
    if not isinstance(lowercase, bool):
        raise CheckpointError(f"{st_config}: do_lower_case={lowercase!r} must be true or false")
    tokenizer_config = module / "tokenizer_config.json"
    if max_len is None and tokenizer_config.is_file():
        value = read_json(tokenizer_config).get("model_max_length")
        # an unset length is saved as a huge number (1e30): the model's own limit applies then
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value < 1_000_000:
            max_len = value
    return max_len, lowercase


def _check_module_order(folder: Path, kinds: list[str]) -> None:
    """Transformer, then Pooling, then Dense modules, then Normalize: the order ortformer computes."""
    rank = {"Transformer": 0, "MLMTransformer": 0, "Pooling": 1, "SpladePooling": 1, "Dense": 2, "Normalize": 3}
    order = [rank[k] for k in kinds]
    once = [r for r in order if r != rank["Dense"]]
    if order != sorted(order) or len(set(once)) != len(once) or ("Dense" in kinds and "Pooling" not in kinds):
        raise CheckpointError(
            f"{folder / 'modules.json'} lists modules {kinds}; ortformer computes Transformer, Pooling, "
            "Dense modules, Normalize, in this order and each but Dense at most once (a Dense needs a Pooling before it)")


def _chain(layers: list[DenseLayer]) -> DenseHead | None:
    """The Dense modules as one head; refused unless each feeds the next linearly."""
    if not layers:
        return None
    for before, after in zip(layers, layers[1:]):
        if before.activation != "identity":
            raise CheckpointError(f"{before.folder / 'config.json'}: a Dense with activation {before.activation!r} "
                                  "before another Dense is not supported; ortformer folds Dense modules into one, "
                                  "which needs every one but the last to be linear (torch.nn.Identity)")
        if after.in_features != before.out_features:
            raise CheckpointError(f"{after.folder / 'config.json'}: in_features={after.in_features} must equal the "
                                  f"out_features={before.out_features} of the Dense before it")
    return DenseHead(tuple(layers))


def _dense_layer(module_dir: Path) -> DenseLayer:
    """A Dense module's config, checked to be the plain pooled-vector map ortformer implements."""
    path = module_dir / "config.json"
    config = read_json(path)
    for key in ("in_features", "out_features"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{path}: {key}={value!r} must be a positive int")
    bias = config.get("bias", True)
    if not isinstance(bias, bool):
        raise CheckpointError(f"{path}: bias={bias!r} must be true or false")
    if config.get("use_residual", False) is not False:
        raise CheckpointError(f"{path}: use_residual={config['use_residual']!r} is not supported; "
                              "ortformer implements the Dense module without a residual connection")
    for key in ("module_input_name", "module_output_name"):
        if config.get(key) not in (None, "sentence_embedding"):
            raise CheckpointError(f"{path}: {key}={config[key]!r} is not supported; ortformer applies Dense "
                                  "to the pooled sentence_embedding only")
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    name = activation.rsplit(".", 1)[-1] if isinstance(activation, str) and activation.startswith("torch.") else None
    if name not in ST_DENSE_ACTIVATIONS:
        raise CheckpointError(f"{path}: activation_function={activation!r} is not supported; valid: "
                              f"torch.nn.{', torch.nn.'.join(ST_DENSE_ACTIVATIONS)}")
    return DenseLayer(module_dir, config["in_features"], config["out_features"], ST_DENSE_ACTIVATIONS[name], bias)


def dense_tensors(head: DenseHead, hidden_size: int) -> tuple[Tensors, list[Path]]:
    """The Dense head's weights under the Encoder's names, and the files they came from. Several
    modules are multiplied out in float64 (W = W_k ... W_1, b = W_k (... b_1 ...) + b_k), which
    rounds once instead of once per module."""
    first = head.layers[0]
    if first.in_features != hidden_size:
        raise CheckpointError(f"{first.folder / 'config.json'}: in_features={first.in_features} must equal the "
                              f"encoder's hidden_size {hidden_size}: the Dense module maps the pooled vector")
    files, parts = [], []
    for layer in head.layers:
        weights = find_weights(layer.folder, HF_WEIGHT_NAMES, sharded=True)
        raw, _, duplicates = read_weights(weights)
        unknown = sorted(set(raw) - set(ST_DENSE_WEIGHTS))
        if unknown:
            raise CheckpointError(f"{weights}: holds {unknown}; a Dense module holds {', '.join(ST_DENSE_WEIGHTS)}")
        if duplicates:
            raise CheckpointError(f"{weights}: names tensors {sorted(set(duplicates))} more than once")
        files.append(weights)
        parts.append({ST_DENSE_WEIGHTS[k]: v for k, v in raw.items()})
    if len(parts) == 1:
        return parts[0], files
    w_name, b_name = ST_DENSE_WEIGHTS.values()
    for layer, part, weights in zip(head.layers, parts, files):  # shapes and values before multiplying out
        shapes = {w_name: (layer.out_features, layer.in_features), **({b_name: (layer.out_features,)} if layer.bias else {})}
        check_tensors(part, shapes, dtypes=HF_DTYPES, what=str(weights))
    weight, bias = parts[0][w_name].double(), parts[0].get(b_name)
    bias = None if bias is None else bias.double()
    for part in parts[1:]:
        w = part[w_name].double()
        bias = None if bias is None else w @ bias
        if b_name in part:
            bias = part[b_name].double() + (0 if bias is None else bias)
        weight = w @ weight
    return {w_name: weight.float(), **({b_name: bias.float()} if bias is not None else {})}, files


def _module_kind(module: dict) -> str:
    """'Pooling' from 'sentence_transformers.models.Pooling' or the newer module paths."""
    kind = str(module.get("type", ""))
    return kind.rsplit(".", 1)[-1] if kind.startswith("sentence_transformers.") else kind


def read_st_model_config(folder: Path) -> tuple[dict[str, str], str | None, int | None]:
    """``prompts``, ``default_prompt_name`` and ``truncate_dim`` of config_sentence_transformers.json
    ({}, None and None without)."""
    path = folder / "config_sentence_transformers.json"
    if not path.is_file():
        return {}, None, None
    data = read_json(path)
    prompts = data.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise CheckpointError(f"{path}: prompts must be an object of name -> prompt text, got {brief(prompts, 80)}")
    default = data.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise CheckpointError(f"{path}: default_prompt_name {default!r} is not among the prompts {sorted(prompts)}")
    truncate_dim = data.get("truncate_dim")
    if truncate_dim is not None and (isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int) or truncate_dim < 1):
        raise CheckpointError(f"{path}: truncate_dim={truncate_dim!r} must be null or an int >= 1")
    return prompts, default, truncate_dim


# sentence-transformers pooling modes (its pooling_mode key, or the older pooling_mode_* flags)
ST_POOLINGS = {"mean": "mean", "cls": "cls", "lasttoken": "last", "max": "max", "mean_sqrt_len_tokens": "mean_sqrt_len",
               "weightedmean": "weighted_mean"}
ST_LEGACY_POOLINGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                      "pooling_mode_lasttoken": "lasttoken", "pooling_mode_max_tokens": "max",
                      "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                      "pooling_mode_weightedmean_tokens": "weightedmean"}


def _pooling_mode(config: dict) -> str:
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        modes = [mode] if isinstance(mode, str) else list(mode) if isinstance(mode, list) else [repr(mode)]
    else:
        modes = [ST_LEGACY_POOLINGS.get(k, k.removeprefix("pooling_mode_"))
                 for k, v in config.items() if k.startswith("pooling_mode_") and v]
    if len(modes) != 1 or modes[0] not in ST_POOLINGS:
        raise CheckpointError(
            f"sentence-transformers pooling {modes or 'none'} is not supported; "
            f"valid: exactly one of {', '.join(ST_POOLINGS)}"
        )
    if config.get("include_prompt", True) is not True:
        raise CheckpointError(
            f"sentence-transformers pooling include_prompt={config['include_prompt']!r} is not supported; "
            "ortformer pools over every kept token, prompt included (include_prompt=true)"
        )
    return ST_POOLINGS[modes[0]]


def import_folder(folder, *, family: str, build: Callable[[dict, dict], EncoderConfig], map_weights: MapWeights,
                  pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a Hugging Face folder (with or without a sentence-transformers layout).

    build(hf_config, common) -> EncoderConfig, where common holds pooling,
    normalize_embeddings and name; map_weights(tensors, cfg, what, duplicates) ->
    (ortformer-named tensors, dropped names), checking what it maps.
    pooling / normalize override the sentence-transformers config; without one the
    default is pooling="none" (a base model's pooler is not imported). A classifier's head
    (config.json's architectures, heads.py) becomes the logits output.
    """
    root = Path(folder)
    if not root.is_dir():
        raise CheckpointError(f"{root} is not a folder; pass a Hugging Face model folder")
    model_dir = transformer_dir(root)
    hf_config = read_json(model_dir / "config.json")
    st = read_sentence_config(root)
    pooling = pooling or st.pooling or "none"
    if normalize is None:  # a Normalize module means nothing without a pooled embedding
        normalize = st.normalize and pooling != "none"
    # a Dense head maps the pooled vector: without a pooling (pooling="none") it has nothing to map
    dense = st.dense if st.dense is not None and pooling != "none" else None
    # a fine-tuned classifier (config.json's architectures) keeps its head as the logits output,
    # unless a sentence-transformers Pooling module embeds with the base model (AutoModel: the head
    # is never run there); SPLADE pools the masked-LM head's logits
    sparse = pooling in SPLADE_POOLINGS
    model_type = hf_config.get("model_type")
    if sparse:
        classifier = mlm_head(hf_config, model_type, str(model_dir))
    else:
        classifier = None if st.pooling is not None else classifier_head(hf_config, model_type, str(model_dir))
    common = {"pooling": pooling, "normalize_embeddings": normalize, "name": name or folder_name(root),
              **(dense.fields() if dense else {}), **(classifier.fields() if classifier else {}),
              **({"splade_activation": st.splade_activation} if sparse else {})}
    cfg = build(hf_config, common)
    # sentence-transformers truncates sentence embeddings only (a SPLADE model's are vocabulary weights);
    # a truncate_dim at or past the width keeps them whole, as its slice does
    if st.truncate_dim and pooling != "none" and not sparse and st.truncate_dim < cfg.sentence_size:
        cfg = cfg.replace(truncate_dim=st.truncate_dim)
    weights = find_weights(model_dir, HF_WEIGHT_NAMES, sharded=True)
    raw, _, duplicates = read_weights(weights)
    mapped, dropped = map_weights(raw, cfg, str(weights), duplicates)
    if classifier is not None:
        head_raw, aliased = mlm_inputs(classifier, raw, mapped.get("tokens.weight")) if sparse else (raw, set())
        head_tensors, used = classifier.tensors(head_raw, cfg.hidden_size, cfg.bias, str(weights))
        mapped, dropped = {**mapped, **head_tensors}, [d for d in dropped if d not in used | aliased]
    if dropped:
        log.info("not imported from %s (unused by an encoder): %s", weights, ", ".join(dropped))
    files = [weights]
    if dense is not None:
        head, dense_files = dense_tensors(dense, cfg.hidden_size)
        mapped, files = {**mapped, **head}, [weights, *dense_files]
    model = encoder_from_tensors(cfg, mapped, what=f"{weights} (mapped)", dtypes=HF_DTYPES)
    # sentence-transformers truncates at the smaller of max_seq_length and what the model takes
    max_len = min(st.max_seq_length, cfg.max_sequence) if st.max_seq_length else None
    return Loaded(model, weights_source(*files), find_tokenizer(model_dir, root), max_len, st.lowercase,
                  weights=weights, dropped=tuple(dropped), family=family, prompts=dict(st.prompts),
                  default_prompt=st.default_prompt, labels=classifier.labels if classifier else ())


# folder names that say nothing of the model: its name is then the folder above
GENERIC_FOLDER_NAMES = {"model", "models", "checkpoint", "checkpoints", "weights", "files", "hf", "transformer"}


def folder_name(root: Path) -> str:
    """The model's name from its folder (`ortformer info`, Triton's header): the folder's own
    name, the repository's for a Hugging Face cache snapshot (models--org--name/snapshots/<hash>),
    the folder above for a generic name ("model", as packages ship weights)."""
    root = root.resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        return root.parent.parent.name.rsplit("--", 1)[-1]
    if root.name.lower() in GENERIC_FOLDER_NAMES and root.parent.name:
        return root.parent.name
    return root.name


def make_config(what: str, **fields) -> EncoderConfig:
    """EncoderConfig(**fields), a CheckpointError when the folder describes one ortformer cannot build."""
    try:
        return EncoderConfig(**fields)
    except ConfigError as exc:
        raise CheckpointError(f"{what} config.json describes an encoder ortformer cannot build: {exc}") from None


def require(hf: dict, what: str, keys: tuple[str, ...]) -> None:
    """CheckpointError unless config.json holds every key of ``keys`` as an int >= 1 (sizes, counts)."""
    missing = [key for key in keys if key not in hf]
    if missing:
        raise CheckpointError(f"{what} config.json lacks {', '.join(missing)}")
    bad = [f"{key}={hf[key]!r}" for key in keys if isinstance(hf[key], bool) or not isinstance(hf[key], int) or hf[key] < 1]
    if bad:
        raise CheckpointError(f"{what} config.json {', '.join(bad)}: sizes and counts must be ints >= 1")


def refuse(hf: dict, key: str, supported: tuple, default=None, what: str = "") -> None:
    """CheckpointError unless hf[key] (default when absent) is one of ``supported``."""
    value = hf.get(key, default)
    if value not in supported:
        names = ", ".join("null (or no such key)" if v is None else repr(v) for v in supported)
        raise CheckpointError(f"{what}config.json {key}={value!r} is not supported; ortformer implements {names}")


# tokenizer files of older saves (WordPiece / BPE vocabularies, sentencepiece models): the
# tokenizers library reads tokenizer.json only, which transformers writes beside them
LEGACY_TOKENIZER_FILES = ("vocab.txt", "vocab.json", "merges.txt", "spm.model", "spiece.model",
                          "sentencepiece.bpe.model", "tokenizer.model")


def missing_tokenizer_note(folder) -> str | None:
    """Why a folder without tokenizer.json exports for token ids only, when it holds a
    tokenizer in an older format; None when it has tokenizer.json or nothing of the kind."""
    root = Path(folder)
    if not root.is_dir():
        return None
    model_dir = transformer_dir(root)
    if find_tokenizer(model_dir, root) is not None:  # (callers also ask only when none was built from vocab.txt)
        return None
    found = sorted({name for d in (model_dir, root) for name in LEGACY_TOKENIZER_FILES if (d / name).is_file()})
    if not found:
        return None
    return (f"{root} holds {', '.join(found)} but no tokenizer.json, so the model takes token ids only; "
            f"write one with transformers (AutoTokenizer.from_pretrained(FOLDER).save_pretrained(FOLDER)) "
            f"and export again, or pass --tokenizer")


def find_tokenizer(model_dir: Path, root: Path) -> Path | None:
    """tokenizer.json in the Transformer module's folder, else the root, else None."""
    return next((d / TOKENIZER_NAME for d in (model_dir, root) if (d / TOKENIZER_NAME).is_file()), None)


def rope_theta(hf: dict, default: float, what: str) -> float:
    """The theta of config.json's rope_parameters (one entry for every layer), else of its older
    rope_theta key, else ``default``: default_rope_theta's checks."""
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"{what}config.json rope_parameters={brief(params, 80)} is not supported")
    return default_rope_theta(params, hf.get("rope_theta", default), what)


def default_rope_theta(rope: dict, fallback: float, what: str, where: str = "rope_parameters") -> float:
    """The theta of config.json's ``where`` (a rope_parameters entry; ``fallback`` when it has
    none), CheckpointError unless it describes the default rope over the whole head."""
    refuse(rope, "rope_type", ("default",), "default", f"{what}{where} in ")
    extra = sorted(set(rope) - {"rope_type", "rope_theta", "partial_rotary_factor"})
    if extra or rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError(f"{what}config.json {where} sets {', '.join(extra) or 'partial_rotary_factor'}; "
                              "ortformer implements the default rope over the whole head (rope_type and rope_theta)")
    theta = rope.get("rope_theta", fallback)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise CheckpointError(f"{what}config.json rope_theta={theta!r} is not supported; it must be a number > 0")
    return float(theta)
