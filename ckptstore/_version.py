"""The package version, in a module of its own: ``ckptstore/__init__.py`` re-exports it, and
the layers below the public API (the DCP writer records it in each manifest) read it here,
so they never import the package facade."""

__all__ = ["__version__"]

__version__ = "0.1.0"
