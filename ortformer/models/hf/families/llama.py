"""Import Llama-layer encoders: EuroBERT (``eurobert``, bidirectional), UltraBERT (``ultrabert``:
bidirectional with sliding windows), and the causal decoders used as embedders with last-token
pooling: Qwen3 (``qwen3``: Qwen3-Embedding), Qwen2 (``qwen2``: Qwen2 / Qwen2.5 classifiers and reward
models, embedders without remote code), Mistral (``mistral``: e5-mistral-7b-instruct,
SFR-Embedding-Mistral, Linq-Embed-Mistral) and Llama (``llama``).

transformers' EuroBertModel / UltrabertModel / Qwen3Model / Qwen2Model / MistralModel / LlamaModel, with RMSNorm n(x) = w * x / sqrt(mean(x^2) + eps):

    x = embed_tokens(ids);  per layer:  x = x + o(attn(n_1(x)));  x = x + down(act(gate(n_2 x)) * up(n_2 x))
    out = n_final(x)

with rotate-half rotary positions at the sequence index and scores scaled by 1/sqrt(D): ortformer's
pre-norm ``rmsnorm`` encoder with a final norm, ``ffn_gated`` (rows [gate; up], the activated half
first) and ``positions = "rotary"``. Qwen3 attends causally (token i sees j <= i) and RMS-normalises
each head's q and k before the rotation (``qk_norm``). Grouped-query attention (num_key_value_heads <
heads) is kept (``num_kv_heads``): K and V project to their own heads, each repeated in the graph
for the query heads that share it, which is what Llama's repeat_kv computes. UltraBERT's sliding layers attend to |i - j| <= sliding_window (a
radius: a local_attention ``window = 2 sliding_window``), its full layers to every key; layer l is full when
(l + 1) % 3 == 0 unless ``layer_types`` (or the older per-layer ``attention_windows``, 0 = full) says
otherwise, and each kind rotates with its own theta (``rope_parameters``, or the older per-layer
``rope_theta`` list). Mistral's causal window (token i sees i - sliding_window < j <= i), and Qwen2's
/ Qwen3's where use_sliding_window puts layers in it, is a causal local_attention ``window`` of 2 sliding_window - 1
(windows.causal_pattern); a layer pattern no period gives (Qwen2's full layers below max_window_layers)
caps the longest sequence at the window instead, where it never acts. Each family reads the bias flags its
transformers model reads (Qwen2 and Mistral none, Qwen3 attention_bias only). A Mistral or
Llama (or Qwen2) folder naming remote code (``auto_map``) is refused: such code often changes the
attention (a bidirectional fine-tune such as gte-Qwen2) where config.json still says the model_type.
One ``bias`` field covers every Linear: Qwen2's q, k and v always have one, ``attention_bias`` /
``mlp_bias`` give one to the attention / MLP Linears, and the Linears saved without a bias get a zero
one (RMSNorm has none either way).

Classifiers: a per-token head is one Linear; EuroBERT's per-sequence head with ``classifier_pooling``
"bos" or "mean" is W_o gelu(W_h v + b_h) + b_o on the first token or the mean ("late", the mean of
per-token logits, is refused); UltraBERT's is W_o v + b_o on the first token ("cls") or the mean;
the decoders' (Qwen3, Qwen2, Mistral, Llama) is one "score" Linear on the last kept token whose id is not the
pad id (heads.py). The LM
heads are dropped.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ....config import EncoderConfig
from ....core.checks import brief
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..activations import ACTIVATIONS
from ..config_checks import make_config, refuse, require, rope_theta
from ..folder_import import import_folder
from ..folder_files import FolderFiles
from ..folder_layout import HF_DTYPES
from ..llm_reranker import reranker_head, template_name
from .. import family as registry  # (this module's own Family holds each decoder's settings)
from ..windows import FULL, SLIDING, causal_pattern, check_layer_types, global_period, pattern_fields, rope_thetas

REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")
# task heads of the For... checkpoints (the base model sits under "model.")
DROPPED_PREFIXES = ("lm_head.", "dense.", "classifier.", "score.", "head.", "cls.")
ATTENTION_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
MLP_LINEARS = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
LINEARS = ATTENTION_LINEARS + MLP_LINEARS


@dataclass(frozen=True)
class Family:
    what: str
    causal: bool
    qk_norm: bool
    theta: float  # transformers' default rope theta
    eps: float  # transformers' default rms_norm_eps
    max_positions: int  # transformers' default max_position_embeddings
    windows: bool = False  # sliding-window layers (UltraBERT)
    base: str = "model."  # the prefix of the base model in task models (besides "model.")
    # a decoder whose remote code (auto_map) may change the attention (e.g. bidirectional): refused
    native_only: bool = False
    # Mistral's causal sliding window (i - j < sliding_window) in every layer
    sliding_everywhere: bool = False
    # Qwen2 / Qwen3: use_sliding_window puts layers l >= max_window_layers (or layer_types' sliding ones) in
    # that causal window
    window_switch: bool = False
    always_biased: tuple[str, ...] = ()  # Linears saved with a bias whatever config.json says (Qwen2's q, k, v)
    bias_keys: tuple[str, ...] = ("attention_bias", "mlp_bias")  # the config.json flags its model reads
    kv_default: int | None = None  # transformers' num_key_value_heads when config.json has no such key


FAMILIES = {"eurobert": Family("EuroBERT ", False, False, 10000.0, 1e-5, 8192),
            "qwen3": Family("Qwen3 ", True, True, 10000.0, 1e-6, 32768, window_switch=True,
                            bias_keys=("attention_bias",), kv_default=32),
            "qwen2": Family("Qwen2 ", True, False, 10000.0, 1e-6, 32768, native_only=True, window_switch=True,
                            always_biased=ATTENTION_LINEARS[:3], bias_keys=(), kv_default=32),
            "ultrabert": Family("UltraBERT ", False, False, 2_560_000.0, 1e-6, 32768, windows=True, base="ultrabert."),
            "mistral": Family("Mistral ", True, False, 10000.0, 1e-6, 131072, native_only=True, sliding_everywhere=True,
                              bias_keys=(), kv_default=8),
            "llama": Family("Llama ", True, False, 10000.0, 1e-6, 2048, native_only=True)}
# UltraBERT's defaults: layer l full when (l + 1) % 3 == 0, a radius of 128, thetas per layer kind
ULTRABERT_PATTERN, ULTRABERT_RADIUS = 3, 128
ULTRABERT_THETA = {FULL: (None, 2_560_000.0), SLIDING: (None, 10_000.0)}


def kv_heads(hf: dict, what: str, default: int | None = None) -> int:
    """EncoderConfig's num_kv_heads from num_key_value_heads, read as transformers reads it: ``default``
    (the family's) when config.json has no such key, one per query head when it (or the default) is
    null; 0 when every query head has its own K / V head."""
    heads, kv = hf["num_attention_heads"], hf.get("num_key_value_heads", default)
    kv = heads if kv is None else kv
    if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or heads % kv:
        raise CheckpointError(f"{what}config.json num_key_value_heads={kv!r} is not supported; it must be an int "
                              f"that divides num_attention_heads={heads}")
    return 0 if kv == heads else kv


BIAS_FLAGS = {"attention_bias": ATTENTION_LINEARS, "mlp_bias": MLP_LINEARS}


def biases(hf: dict, what: str, always: tuple[str, ...] = (), keys: tuple[str, ...] = tuple(BIAS_FLAGS)
           ) -> frozenset[str]:
    """The Linears (LINEARS names) saved with a bias: the attention ones with attention_bias, the MLP
    ones with mlp_bias (of the flags in ``keys``, those the family's model reads), and ``always``."""
    flags = {key: hf.get(key, False) for key in keys}
    if not all(isinstance(flag, bool) for flag in flags.values()):
        raise CheckpointError(f"{what}config.json {', '.join(f'{k}={v!r}' for k, v in flags.items())}: each must be "
                              "true or false")
    return frozenset(always).union(*(BIAS_FLAGS[key] for key, flag in flags.items() if flag))


def sliding_layers(hf: dict, family: Family, what: str) -> tuple[list[str], int | None]:
    """(each layer's kind, the causal sliding window w) (token i sees i - w < j <= i in a sliding layer):
    Mistral's on every layer (none when sliding_window is null); Qwen2 / Qwen3's with use_sliding_window
    on layers l >= max_window_layers, or layer_types' sliding ones."""
    layers = hf["num_hidden_layers"]
    if family.sliding_everywhere:
        kinds, window = [SLIDING] * layers, hf.get("sliding_window", 4096)  # transformers' default
    elif family.window_switch:
        use = hf.get("use_sliding_window", False)
        if not isinstance(use, bool):
            raise CheckpointError(f"{what}config.json use_sliding_window={use!r} must be true or false")
        first = hf.get("max_window_layers", 28)
        if hf.get("layer_types") is not None:
            kinds = check_layer_types(hf["layer_types"], layers, what)
            if SLIDING in kinds and not use:  # transformers gives such a layer no window: a config at odds with itself
                raise CheckpointError(f"{what}config.json layer_types lists sliding layers but use_sliding_window is "
                                      "false; set one or the other")
        elif not use:  # max_window_layers means nothing then, as transformers reads it
            kinds = [FULL] * layers
        elif isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise CheckpointError(f"{what}config.json max_window_layers={first!r} must be an int >= 0")
        else:
            kinds = [SLIDING if l >= first else FULL for l in range(layers)]
        window = hf.get("sliding_window", 4096) if use and SLIDING in kinds else None
        if use and SLIDING in kinds and window is None:  # transformers cannot load this either
            raise CheckpointError(f"{what}config.json has sliding layers but sliding_window=null; give the window "
                                  "(an int >= 1) or set use_sliding_window to false")
    else:
        return [FULL] * layers, None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise CheckpointError(f"{what}config.json sliding_window={window!r} is not supported; it must be null "
                              "or an int >= 1")
    return kinds, window


def ultrabert_pattern(hf: dict, layers: int, what: str) -> dict:
    """UltraBERT's sliding-window fields: the local_attention group (window, global_every / global_offset,
    the sliding layers' theta) and the full layers' rotary theta, from layer_types and rope_parameters or
    the older per-layer attention_windows and rope_theta lists, read as transformers reads them."""
    windows = hf.get("attention_windows")
    if windows is not None and not (isinstance(windows, list) and len(windows) == layers and all(
            isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in windows)):
        raise CheckpointError(f"{what}config.json attention_windows={brief(windows, 120)} is not supported; it must list "
                              f"an int >= 0 (0 = full attention) for each of the {layers} layers")
    radius = hf.get("sliding_window", ULTRABERT_RADIUS)
    if windows:  # as transformers reads them: the first window any layer has
        radius = next((w for w in windows if w), radius)
    if hf.get("layer_types") is not None:
        kinds, source = check_layer_types(hf["layer_types"], layers, what), "layer_types"
    elif windows is not None:
        kinds, source = [SLIDING if w else FULL for w in windows], "attention_windows"
    else:  # the default pattern is always periodic
        kinds, source = [SLIDING if (l + 1) % ULTRABERT_PATTERN else FULL for l in range(layers)], None
    every, offset = global_period(kinds, what, source)
    if every > 1 and (isinstance(radius, bool) or not isinstance(radius, int) or radius < 1):
        raise CheckpointError(f"{what}config.json sliding_window={radius!r} is not supported; it must be an int >= 1 "
                              "(the radius |i - j| <= sliding_window)")
    if hf.get("rope_parameters") is None and hf.get("rope_theta") is not None:
        # older saves: one theta per layer, read per kind (the last layer of a kind decides)
        if not isinstance(hf["rope_theta"], list):
            raise CheckpointError(f"{what}config.json rope_theta={hf['rope_theta']!r} is not supported; UltraBERT "
                                  "lists one theta per layer (or give rope_parameters per layer kind)")
        thetas = dict(zip(kinds, hf["rope_theta"]))
        hf = {**hf, "rope_parameters": {kind: {"rope_type": "default", "rope_theta": theta}
                                        for kind, theta in thetas.items()}}
    thetas = rope_thetas(hf, ULTRABERT_THETA, what)
    return pattern_fields(2 * radius if every > 1 else 0, every, offset, thetas, what)


def llama_config(hf: dict, common: dict) -> EncoderConfig:
    family = FAMILIES[hf["model_type"]]
    what = family.what
    require(hf, what.strip(), REQUIRED)
    refuse(hf, "hidden_act", tuple(ACTIVATIONS), "silu", what)
    refuse(hf, "rope_scaling", (None,), None, what)
    refuse(hf, "pretraining_tp", (1,), 1, what)
    if not family.window_switch:
        refuse(hf, "use_sliding_window", (False,), False, what)
    if family.native_only and hf.get("auto_map"):
        raise CheckpointError(f"{what}config.json names remote code (auto_map {brief(hf['auto_map'], 120)}), which may "
                              f"compute attention otherwise than transformers' {what.strip()} model (e.g. "
                              "bidirectionally); ortformer imports the transformers architecture only. If that code "
                              f"computes what transformers' {what.strip()} model does, remove auto_map from config.json")
    max_positions = hf.get("max_position_embeddings", family.max_positions)
    if family.windows:
        positions = ultrabert_pattern(hf, hf["num_hidden_layers"], what)
    else:
        layer_types = hf.get("layer_types") or []
        if not family.window_switch and (not isinstance(layer_types, list) or set(layer_types) - {FULL}):
            raise CheckpointError(f"{what}config.json layer_types={brief(layer_types, 120)} is not supported; ortformer "
                                  "implements full attention in every layer")
        theta = rope_theta(hf, family.theta, what)
        kinds, window = sliding_layers(hf, family, what)
        positions, max_positions = causal_pattern(kinds, window, max_positions, {FULL: theta, SLIDING: theta}, what)
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    return make_config(
        what.strip(), vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_heads=heads,
        attention_head_size=0 if head_dim * heads == hf["hidden_size"] else head_dim,
        num_kv_heads=kv_heads(hf, what, family.kv_default), num_layers=hf["num_hidden_layers"],
        ffn_size=hf["intermediate_size"],
        ffn_gated=True, bias=bool(biases(hf, what, family.always_biased, family.bias_keys)),
        attention="softmax", causal=family.causal, qk_norm=family.qk_norm, norm="rmsnorm", norm_position="pre",
        activation=ACTIVATIONS[hf.get("hidden_act", "silu")], positions="rotary", **positions,
        max_positions=max_positions, type_vocab_size=0, norm_eps=hf.get("rms_norm_eps", family.eps), **common)


def linear_shapes(cfg: EncoderConfig, biased: frozenset[str]) -> dict[str, tuple[int, ...]]:
    """Saved name -> shape of every layer's attention and MLP Linears (Llama, Gemma), K and V
    cfg.kv_size wide, a bias for each of the ``biased`` Linears."""
    f, ffn, a, kv = cfg.hidden_size, cfg.ffn_size, cfg.attention_size, cfg.kv_size
    shapes = dict(zip(LINEARS, ((a, f), (kv, f), (kv, f), (f, a), (ffn, f), (ffn, f), (f, ffn))))
    out = {}
    for i in range(cfg.num_layers):
        for name, shape in shapes.items():
            out[f"layers.{i}.{name}.weight"] = shape
            if name in biased:
                out[f"layers.{i}.{name}.bias"] = shape[:1]
    return out


LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")  # Llama's: before attention, before the MLP


def names(cfg: EncoderConfig, biased: frozenset[str], norms: tuple[str, ...] = LAYER_NORMS
          ) -> dict[str, tuple[int, ...]]:
    """Saved tensor name -> shape, the ``biased`` Linears, each layer's
    ``norms`` (F wide) and, with qk_norm, its q / k norms (D wide)."""
    f, d = cfg.hidden_size, cfg.head_size
    shapes = {"embed_tokens.weight": (cfg.vocab_size, f), "norm.weight": (f,), **linear_shapes(cfg, biased)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes.update({f"{p}{norm}.weight": (f,) for norm in norms})
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = shapes[p + "self_attn.k_norm.weight"] = (d,)
    return shapes


def base_tensors(raw: Tensors, dropped_prefixes: tuple[str, ...], base: str = "model.") -> tuple[Tensors, list[str]]:
    """(the base model's tensors with "model." (or the task models' ``base`` prefix) taken off, the
    names set aside: task heads and stored rotary frequencies)."""
    kept, dropped = {}, []
    for name, tensor in raw.items():
        short = name.removeprefix("model.").removeprefix(base)
        if short.startswith(dropped_prefixes) or short.endswith("inv_freq"):
            dropped.append(name)
        else:
            kept[short] = tensor
    return kept, dropped


def map_linears(kept: Tensors, cfg: EncoderConfig, query_scale: float = 1.0) -> Tensors:
    """Every layer's Linears under the Encoder's names: q, k, v fused (K and V keep their
    num_kv_heads heads: grouped-query attention shares them in the graph; q's weight and bias times
    ``query_scale``, in float32), [gate; up] fused, zero biases where a Linear has none and another has."""
    def part(p: str, name: str, kind: str) -> torch.Tensor:
        key = f"{p}{name}.{kind}"
        return kept[key] if kind == "weight" or key in kept else torch.zeros(kept[f"{p}{name}.weight"].shape[0])

    out = {}
    for i in range(cfg.num_layers):
        p, q = f"layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias") if cfg.bias else ("weight",):
            attn = [part(p, f"self_attn.{n}_proj", kind) for n in "qkv"]
            if query_scale != 1.0:
                attn[0] = attn[0].float() * query_scale
            out[q + f"attention.qkv.{kind}"] = torch.cat(attn)
            out[q + f"attention.out.{kind}"] = part(p, "self_attn.o_proj", kind)
            out[q + f"ffn.up.{kind}"] = torch.cat([part(p, "mlp.gate_proj", kind), part(p, "mlp.up_proj", kind)])
            out[q + f"ffn.down.{kind}"] = part(p, "mlp.down_proj", kind)
    return out


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates, biased: frozenset[str],
                base: str = "model.") -> tuple[Tensors, list[str]]:
    """Check a state dict and map it: the Linears by map_linears, the norms renamed."""
    kept, dropped = base_tensors(raw, DROPPED_PREFIXES, base)
    check_tensors(kept, names(cfg, biased), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    out = {"tokens.weight": kept["embed_tokens.weight"], "norm.weight": kept["norm.weight"],
           **map_linears(kept, cfg)}
    for i in range(cfg.num_layers):
        p, q = f"layers.{i}.", f"blocks.{i}."
        out[q + "norm1.weight"], out[q + "norm2.weight"] = kept[p + "input_layernorm.weight"], kept[p + "post_attention_layernorm.weight"]
        if cfg.qk_norm:
            out[q + "attention.q_norm.weight"] = kept[p + "self_attn.q_norm.weight"]
            out[q + "attention.k_norm.weight"] = kept[p + "self_attn.k_norm.weight"]
    return out, sorted(dropped)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a EuroBERT, UltraBERT, Qwen3, Qwen2, Mistral or Llama folder as an ortformer Encoder."""
    files = FolderFiles.of(folder)  # parsed once: load_any hands over the files it read
    hf = files.config
    family = FAMILIES[hf["model_type"]]

    def weights(raw, cfg, where, duplicates):
        return map_weights(raw, cfg, where, duplicates, biases(hf, family.what, family.always_biased, family.bias_keys),
                           family.base)

    kind = template_name(files.root, hf)  # Qwen3-Reranker / mxbai-rerank-v2: the yes / no head
    return import_folder(files, family=hf["model_type"], build=llama_config, map_weights=weights,
                         pooling=pooling, normalize=normalize, name=name,
                         reranker=reranker_head(files.model_dir, kind, hf) if kind else None)


FAMILY = registry.Family("Llama-layer", tuple(FAMILIES), load)
