"""The torchtitan versions this plugin is built and tested against.

``SUPPORTED`` is this distribution's ``torchtitan`` requirement (its pyproject.toml, and the
core's ``ckptstore[torchtitan]`` extra; a test keeps the three equal). ``checkpointer``
checks the installed version right after importing torchtitan
(``ckptstore.errors.require_version``), so a version outside the range fails at import,
naming the range and the command that installs a supported one. The plugin subclasses
torchtitan's DCP ``CheckpointManager`` and overrides some of its ``_``-prefixed hooks
(listed in docs/torchtitan.md): torchtitan is pre-1.0, so the range is one minor version.
"""

from __future__ import annotations

__all__ = ["EXTRA", "SUPPORTED"]

#: distribution name -> the versions this plugin supports
SUPPORTED = {"torchtitan": ">=0.3,<0.4"}
#: The core's extra that installs this plugin and its framework.
EXTRA = "torchtitan"
