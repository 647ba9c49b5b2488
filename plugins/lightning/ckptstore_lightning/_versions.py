"""The Lightning versions this plugin is built and tested against.

``SUPPORTED`` is this distribution's ``lightning`` requirement (its pyproject.toml, and the
core's ``ckptstore[lightning]`` extra; a test keeps the three equal). ``io`` checks the
installed version right after importing Lightning (``ckptstore.errors.require_version``),
so a version outside the range fails at import, naming the range and the command that
installs a supported one, rather than later deep inside Lightning. The upper bound is the
next major version, whose internals the plugin has not met.
"""

from __future__ import annotations

__all__ = ["EXTRA", "SUPPORTED"]

#: distribution name -> the versions this plugin supports
SUPPORTED = {"lightning": ">=2.2,<3"}
#: The core's extra that installs this plugin and its framework.
EXTRA = "lightning"
