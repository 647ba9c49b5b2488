"""The Transformers and Accelerate versions this plugin is built and tested against.

``SUPPORTED`` is this distribution's requirements (its pyproject.toml, and the core's
``ckptstore[hf]`` extra; a test keeps them equal). ``hooks`` checks the installed versions
right after importing the frameworks (``ckptstore.errors.require_version``), so a version
outside a range fails at import, naming the range and the command that installs a
supported one. The upper bounds are the next major versions, whose internals the plugin
has not met.
"""

from __future__ import annotations

__all__ = ["EXTRA", "SUPPORTED"]

#: distribution name -> the versions this plugin supports
SUPPORTED = {"transformers": ">=4.40,<6", "accelerate": ">=0.30,<2"}
#: The core's extra that installs this plugin and its frameworks.
EXTRA = "hf"
