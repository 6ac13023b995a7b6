"""What a sentence-transformers layout says about turning token states into one vector:
``modules.json`` lists the modules, ``1_Pooling/config.json`` picks the mode, a ``Dense`` module
after the pooling maps the pooled vector (sentence_dense.py), a ``Normalize`` module means
l2-normalised embeddings, and a sparse encoder's ``SpladePooling`` module pools the masked-LM
head's logits into vocabulary weights (SPLADE); prompts, text length and lowercasing too."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...core.checks import brief
from ...config import SPLADE_ACTIVATIONS, SPLADE_POOLINGS
from ...core.errors import CheckpointError
from .folder_layout import module_dir, module_kind, read_json, st_modules, transformer_dir
from .late_folders import is_pylate
from .sentence_dense import DenseHead, chain_dense, dense_layer


ST_SUPPORTED = {"Transformer", "MLMTransformer", "Pooling", "SpladePooling", "Dense", "Normalize"}


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
    # a multi-vector layout's Dense modules, which project every token (PyLate, or Dense and Normalize
    # reading token_embeddings): late_folders.py makes them the token_embeddings head
    token_dense: DenseHead | None = None


def read_sentence_config(folder: Path, model_dir: Path | None = None,
                         modules: list[dict] | None = None) -> SentenceConfig:
    """Pooling, Normalize, max_seq_length and prompts from sentence-transformers configs.
    model_dir / modules: the Transformer module's folder and modules.json's entries, when the
    caller has them (folder_files.FolderFiles); found and read here otherwise."""
    prompts, default, truncate_dim = read_st_model_config(folder)
    modules = st_modules(folder) if modules is None else modules
    model_dir = transformer_dir(folder) if model_dir is None else model_dir
    st_config = _transformer_settings(model_dir)
    if not modules:  # a plain transformers folder: its tokenizer's model_max_length still truncates
        max_len, lowercase = _text_settings(model_dir, *st_config)
        return SentenceConfig(max_seq_length=max_len, lowercase=lowercase, prompts=prompts, default_prompt=default,
                              truncate_dim=truncate_dim)
    kinds = [module_kind(m) for m in modules]
    unsupported = [k for k in kinds if k not in ST_SUPPORTED]
    if unsupported:
        raise CheckpointError(
            f"{folder / 'modules.json'} uses sentence-transformers modules ortformer does not implement: "
            f"{', '.join(unsupported)}; supported: {', '.join(sorted(ST_SUPPORTED))}"
        )
    if "Dense" in kinds and not {"Pooling", "SpladePooling"} & set(kinds) and _multi_vector(folder, modules, kinds):
        return _token_layout(folder, model_dir, modules, kinds, st_config, prompts, default)
    _check_module_order(folder, kinds)
    _check_transformer_task(folder, kinds, st_config[1])
    pooling, dense, splade_activation = None, [], "relu"
    for module, kind in zip(modules, kinds):
        if kind == "Pooling":
            pooling = _pooling_mode(read_json(module_dir(folder, module) / "config.json"))
        elif kind == "SpladePooling":
            pooling, splade_activation = _splade_mode(module_dir(folder, module) / "config.json")
        elif kind == "Dense":
            dense.append(dense_layer(module_dir(folder, module)))
    max_len, lowercase = _text_settings(model_dir, *st_config)
    return SentenceConfig(pooling, "Normalize" in kinds, max_len, lowercase, prompts, default,
                          chain_dense(dense), splade_activation, truncate_dim)


def _multi_vector(folder: Path, modules: list[dict], kinds: list[str]) -> bool:
    """Dense modules without a Pooling that project tokens: PyLate's, or ones reading token_embeddings."""
    if is_pylate(folder):
        return True
    configs = [module_dir(folder, m) / "config.json" for m, k in zip(modules, kinds) if k == "Dense"]
    return any(path.is_file() and read_json(path).get("module_input_name") == "token_embeddings" for path in configs)


def _token_layout(folder: Path, model_dir: Path, modules: list[dict], kinds: list[str], st_config: tuple,
                  prompts: dict, default: str | None) -> SentenceConfig:
    """Transformer, Dense modules on every token, and (sentence-transformers' layout) a Normalize
    of token_embeddings: the multi-vector folders; PyLate's normalises in its encode instead."""
    pylate = is_pylate(folder)
    body = kinds[1:-1] if kinds[-1] == "Normalize" else kinds[1:]
    if kinds[0] != "Transformer" or set(body) != {"Dense"}:
        raise CheckpointError(f"{folder / 'modules.json'} lists modules {kinds}; a multi-vector folder is a "
                              "Transformer, Dense modules, then (sentence-transformers) a Normalize")
    reads = (None, "sentence_embedding", "token_embeddings") if pylate else ("token_embeddings",)
    dense = [dense_layer(module_dir(folder, m), reads) for m, k in zip(modules, kinds) if k == "Dense"]
    if not pylate:
        normalize = module_dir(folder, modules[-1]) / "config.json" if kinds[-1] == "Normalize" else None
        name = read_json(normalize).get("module_input_name") if normalize is not None and normalize.is_file() else None
        if name != "token_embeddings":
            raise CheckpointError(f"{folder / 'modules.json'}: Dense modules on token_embeddings need a Normalize of "
                                  "token_embeddings after them (module_input_name=\"token_embeddings\"); ortformer's "
                                  "multi-vector output is normalised per token, as ColBERT scores it")
    max_len, lowercase = _text_settings(model_dir, *st_config)
    return SentenceConfig(max_seq_length=max_len, lowercase=lowercase, prompts=prompts, default_prompt=default,
                          token_dense=chain_dense(dense))


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


def _transformer_settings(model_dir: Path) -> tuple[Path | None, dict]:
    """(path, contents) of the Transformer module's sentence_bert_config.json, in the module's
    folder only, as sentence-transformers reads it; (None, {}) without one."""
    st_config = model_dir / "sentence_bert_config.json"
    return (st_config, read_json(st_config)) if st_config.is_file() else (None, {})


def _text_settings(module: Path, st_config: Path | None, settings: dict) -> tuple[int | None, bool]:
    """(max_seq_length, do_lower_case) as sentence-transformers' Transformer module reads them.

    Its sentence_bert_config.json (``st_config``, read as ``settings``) holds both; without a
    max_seq_length (sentence-transformers >= 6 saves none) the tokenizer_config.json's
    model_max_length applies. module: the Transformer module's folder."""
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
