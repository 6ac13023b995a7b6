"""The package version, in a leaf module: the exporter's metadata, the Triton writer and
the bench record it without importing the package's ``__init__`` from below."""

__version__ = "0.1.0"
