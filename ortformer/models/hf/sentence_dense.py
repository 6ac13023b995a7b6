"""sentence-transformers Dense modules after the pooling (s = act(W p + b), e.g. LaBSE,
distiluse); several linear ones in a row are multiplied out into one (EmbeddingGemma)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...config import SentenceDense
from ...core.errors import CheckpointError
from ..weights import Tensors, check_tensors, find_weights, read_weights
from .folder_layout import HF_DTYPES, HF_WEIGHT_NAMES, read_json


# sentence-transformers' Dense activation_function (a torch.nn class path) -> config name;
# the module's default when the key is absent is Tanh
ST_DENSE_ACTIVATIONS = {"Tanh": "tanh", "Identity": "identity", "ReLU": "relu", "GELU": "gelu", "Sigmoid": "sigmoid"}
ST_DENSE_WEIGHTS = {"linear.weight": "sentence_dense.weight", "linear.bias": "sentence_dense.bias"}


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
        """Its EncoderConfig fields: the sentence_dense group."""
        last = self.layers[-1]
        return {"sentence_dense": SentenceDense(size=last.out_features, activation=last.activation,
                                                bias=any(layer.bias for layer in self.layers))}


def chain_dense(layers: list[DenseLayer]) -> DenseHead | None:
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


def dense_layer(module_dir: Path, reads: tuple = (None, "sentence_embedding")) -> DenseLayer:
    """A Dense module's config, checked to be the plain map ortformer implements; ``reads``: the
    module_input_name / module_output_name values it may have (the pooled vector, or with a
    multi-vector layout token_embeddings)."""
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
        if config.get(key) not in reads:
            valid = " or ".join(repr(r) for r in reads if r)
            raise CheckpointError(f"{path}: {key}={config.get(key)!r} is not supported here; ortformer applies this "
                                  f"Dense to {valid} (token_embeddings: a multi-vector folder, without Pooling)")
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
