"""Framework integrations (``ckptstore.plugins.lightning``, ``ckptstore.plugins.hf``).

The code lives in the repository's top-level ``plugins/`` directory. Built wheels map
``ckptstore.plugins`` onto that directory (``package-dir`` in ``pyproject.toml``), so
this file is never installed; in a source checkout (``PYTHONPATH=.`` or an editable
install) it adds ``plugins/`` to this package's search path, so the same import paths
work.
"""

import os

_top = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "plugins")
if os.path.isfile(os.path.join(_top, "__init__.py")):
    __path__.append(os.path.abspath(_top))

__all__: list[str] = []
