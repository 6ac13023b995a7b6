"""Deprecated: import ortformer.contract.cost instead (ortformer.cost is kept as a re-export)."""
import warnings

from .contract.cost import *  # noqa: F401,F403

warnings.warn("ortformer.cost is deprecated; import ortformer.contract.cost", DeprecationWarning, stacklevel=2)
