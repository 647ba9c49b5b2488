"""Plugins import only with their framework, name the install command otherwise, and ship
as ``ckptstore.plugins`` through extras."""

import importlib
import os
import re
import sys

import pytest

from ckptstore.errors import MissingDependencyError
from tests.plugins.util import REPO


def hide(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Make ``package`` (and any of its modules already imported) unimportable."""
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, package, None)


@pytest.mark.parametrize(
    "module, hidden, extra",
    [
        ("ckptstore.plugins.lightning", "lightning", "lightning"),
        ("ckptstore.plugins.hf", "transformers", "hf"),
        ("ckptstore.plugins.hf", "accelerate", "hf"),
    ],
)
def test_missing_framework_names_the_install_command(monkeypatch, module, hidden, extra):
    hide(monkeypatch, hidden)  # as if it were not installed
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(MissingDependencyError) as info:
        importlib.import_module(module)
    assert isinstance(info.value, ImportError)
    assert f"pip install 'ckptstore[{extra}]'" in str(info.value)
    assert repr(hidden) in str(info.value)


def test_ckptstore_and_the_plugins_package_import_no_framework(monkeypatch) -> None:
    for name in ("lightning", "transformers", "accelerate"):
        hide(monkeypatch, name)
    for name in ("ckptstore.plugins", "ckptstore"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.import_module("ckptstore")
    plugins = importlib.import_module("ckptstore.plugins")
    # In a source checkout the package's code is the top-level plugins/ directory.
    assert os.path.join(REPO, "plugins") in [os.path.abspath(p) for p in plugins.__path__]


def test_pyproject_maps_the_package_and_declares_the_extras() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert project["tool"]["setuptools"]["package-dir"]["ckptstore.plugins"] == "plugins"
    extras = project["project"]["optional-dependencies"]
    assert any(re.match(r"lightning\b", d) for d in extras["lightning"])
    assert {re.split(r"[<>=!~ \[]", d)[0] for d in extras["hf"]} == {"transformers", "accelerate"}
