"""Torch encoders built from an EncoderConfig. Importing this needs torch."""
from ..errors import require_torch

require_torch("ortformer.models")

from .attention import KERNELS, MultiHeadAttention, get_kernel  # noqa: E402
from .checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from .encoder import Block, Encoder, build_encoder, pool  # noqa: E402
from .hf.bert import load_bert  # noqa: E402
from .layers import RMSNorm, sinusoid_table  # noqa: E402
from .loaded import Loaded  # noqa: E402
from .loading import load_any  # noqa: E402
from .weights import checkpoint_digest  # noqa: E402

__all__ = ["KERNELS", "MultiHeadAttention", "get_kernel", "Block", "Encoder", "build_encoder", "pool",
           "RMSNorm", "sinusoid_table", "load_bert", "Loaded", "checkpoint_digest", "load_any",
           "load_checkpoint", "save_checkpoint"]
