"""Hugging Face activation names -> config.ACTIVATIONS.

HF "gelu" and "gelu_python" are the exact erf GELU, as nn.GELU(); gelu_new, gelu_pytorch_tanh,
gelu_fast and gelu_accurate are the same tanh approximation
0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), written four ways; swish is silu.
"""

ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "silu": "silu", "swish": "silu", "gelu_python": "gelu", "gelu_fast": "gelu_tanh",
               "gelu_accurate": "gelu_tanh"}
