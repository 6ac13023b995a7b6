"""Deprecated: import ortformer.contract.parity instead (ortformer.parity is kept as a re-export)."""
import warnings

from .contract.parity import *  # noqa: F401,F403

warnings.warn("ortformer.parity is deprecated; import ortformer.contract.parity", DeprecationWarning, stacklevel=2)
