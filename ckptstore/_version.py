"""The package version, in a leaf module every layer may import (``ckptstore.__version__``)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
