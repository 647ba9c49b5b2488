"""The torch_checkpointing versions this plugin is built and tested against.

``SUPPORTED`` is this distribution's requirements (its pyproject.toml, and the core's
``ckptstore[torch-checkpointing]`` extra; a test keeps them equal). ``storage`` checks the
installed version right after importing torch_checkpointing
(``ckptstore.errors.require_version``), so a version outside the range fails at import,
naming the range and the command that installs a supported one. The upper bound is the
next minor version: before 1.0 a minor release may change the ``Storage`` interface.
"""

from __future__ import annotations

__all__ = ["EXTRA", "SUPPORTED"]

#: distribution name -> the versions this plugin supports
SUPPORTED = {"torch-checkpointing": ">=0.1.1,<0.2"}
#: The core's extra that installs this plugin and torch_checkpointing.
EXTRA = "torch-checkpointing"
