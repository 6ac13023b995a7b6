"""Deprecated: import ortformer.core.errors instead (ortformer.errors is kept as a re-export)."""
import warnings

from .core.errors import *  # noqa: F401,F403

warnings.warn("ortformer.errors is deprecated; import ortformer.core.errors", DeprecationWarning, stacklevel=2)
