"""Hugging Face activation names -> config.ACTIVATIONS.

HF "gelu" and "gelu_python" are the exact erf GELU, as nn.GELU(); gelu_new, gelu_pytorch_tanh,
gelu_fast and gelu_accurate are the same tanh approximation
0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), written four ways; swish is silu.
"""
from ...core.errors import CheckpointError

ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "silu": "silu", "swish": "silu", "gelu_python": "gelu", "gelu_fast": "gelu_tanh",
               "gelu_accurate": "gelu_tanh"}


def head_activation(value, key: str, what: str) -> str:
    """A head's or convolution's activation (config.json ``key`` = ``value``) as a
    config.CLASSIFIER_DENSE name: the names above, or tanh; CheckpointError naming the valid ones."""
    ours = "tanh" if value == "tanh" else ACTIVATIONS.get(value) if isinstance(value, str) else None
    if ours is None:
        raise CheckpointError(f"{what} config.json {key}={value!r} is not supported; "
                              f"ortformer implements {', '.join(sorted({*ACTIVATIONS, 'tanh'}))}")
    return ours
