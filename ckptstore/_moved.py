"""Old import paths of modules that moved, kept working with a ``DeprecationWarning``.

``import ckptstore.plugins.lightning`` (and the other names in ``MOVED``) imports the
module's new home and registers it under the old name too, so both names are the same
module object. Written by hand because the standard library has no module-alias hook
short of a meta-path finder; a stub file per old name would re-create the flat top level
the moves removed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: old dotted name -> new dotted name (moved in 0.2).
MOVED = {
    "ckptstore.plugins": "ckptstore.integrations",
    "ckptstore.plugins.lightning": "ckptstore.integrations.lightning",
    "ckptstore.plugins.hf": "ckptstore.integrations.hf",
    "ckptstore.retention": "ckptstore.manager.retention",
    "ckptstore.prune": "ckptstore.manager.prune",
    "ckptstore.state": "ckptstore.manager.state",
    "ckptstore.catalog": "ckptstore.engine.catalog",
    "ckptstore.goodput": "ckptstore.planning.goodput",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; import it from there (the old name goes "
            "away in a later release)",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (``create_module`` returned the imported new module); only put
        back the module's own ``__spec__``, which the import system set to the alias's."""
        module.__spec__ = self.spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object, target: object = None):  # type: ignore[override]
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` once (``import ckptstore`` does)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
