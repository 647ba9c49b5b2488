"""How the plugins ship: each is its own distribution (plugins/<name>), released in lockstep
with the core, installed through the core's extras; the core wheel holds no plugin code."""

import importlib
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from ckptstore import __version__
from ckptstore.errors import MissingDependencyError
from tests.plugins.util import REPO

#: plugin folder -> (distribution, import package, the core's extra that installs it)
PLUGINS = {
    "lightning": ("ckptstore-lightning", "ckptstore_lightning", "lightning"),
    "hf": ("ckptstore-hf", "ckptstore_hf", "hf"),
    "torch_checkpointing": (
        "ckptstore-torch-checkpointing",
        "ckptstore_tc",
        "torch-checkpointing",
    ),
    "torchtitan": ("ckptstore-torchtitan", "ckptstore_titan", "torchtitan"),
}


def hide(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Make ``package`` (and any of its modules already imported) unimportable."""
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, package, None)


def forget(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Drop ``package`` and its modules from ``sys.modules``, so the next import runs it."""
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)


def project(folder: str = "") -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(os.path.join(REPO, folder, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


@pytest.mark.parametrize(
    "module, hidden, extra",
    [
        ("ckptstore_lightning", "lightning", "lightning"),
        ("ckptstore_hf", "transformers", "hf"),
        ("ckptstore_hf", "accelerate", "hf"),
        ("ckptstore_tc", "torch_checkpointing", "torch-checkpointing"),
        ("ckptstore_titan", "torchtitan", "torchtitan"),
    ],
)
def test_missing_framework_names_the_install_command(monkeypatch, module, hidden, extra):
    hide(monkeypatch, hidden)  # as if it were not installed
    forget(monkeypatch, module)
    with pytest.raises(MissingDependencyError) as info:
        importlib.import_module(module)
    assert isinstance(info.value, ImportError)
    assert f"pip install 'ckptstore[{extra}]'" in str(info.value)
    assert repr(hidden) in str(info.value)


def test_ckptstore_imports_no_framework(monkeypatch) -> None:
    for name in ("lightning", "transformers", "accelerate", "torch_checkpointing", "torchtitan"):
        hide(monkeypatch, name)
    forget(monkeypatch, "ckptstore")
    importlib.import_module("ckptstore")


@pytest.mark.parametrize("old", ["ckptstore.integrations.lightning", "ckptstore.integrations.hf"])
def test_the_old_import_path_names_the_new_package_and_the_install(monkeypatch, old) -> None:
    forget(monkeypatch, "ckptstore.integrations")
    with pytest.raises(ImportError) as info:
        importlib.import_module(old)
    msg = str(info.value)
    assert "from ckptstore_lightning import CkptStoreIO" in msg
    assert "pip install 'ckptstore[lightning]'" in msg
    assert "from ckptstore_hf import" in msg and "pip install 'ckptstore[hf]'" in msg


@pytest.mark.parametrize("folder", sorted(PLUGINS))
def test_a_plugin_is_released_in_lockstep_with_the_core(folder) -> None:
    """One version for the core and every plugin; each pins the other at it, and the range
    a plugin checks at import is the one its distribution and the core's extra declare."""
    dist, package, extra = PLUGINS[folder]
    core, plugin = project(), project(f"plugins/{folder}")
    assert plugin["name"] == dist
    assert plugin["version"] == __version__
    assert f"ckptstore=={__version__}" in plugin["dependencies"]
    assert f"{dist}=={__version__}" in core["optional-dependencies"][extra]
    versions = importlib.import_module(f"{package}._versions")
    assert versions.EXTRA == extra
    for name, spec in versions.SUPPORTED.items():
        assert f"{name}{spec}" in plugin["dependencies"]
        assert f"{name}{spec}" in core["optional-dependencies"][extra]


def test_the_extras_keep_their_frameworks() -> None:
    extras = project()["optional-dependencies"]
    assert any(re.match(r"lightning\b", d) for d in extras["lightning"])
    names = {re.split(r"[<>=!~ \[]", d)[0] for d in extras["hf"]}
    assert names == {"ckptstore-hf", "transformers", "accelerate"}
    names = {re.split(r"[<>=!~ \[]", d)[0] for d in extras["torchtitan"]}
    assert names == {"ckptstore-torchtitan", "torchtitan"}


def _wheel(tmp_path, folder: str, copy: list[str], glob: str) -> list[str]:
    """Build the wheel of ``folder`` offline (setuptools from the venv, no index) from a copy
    of ``copy`` (its paths in the checkout), so the checkout gets no build/ or egg-info;
    the names it holds."""
    src = tmp_path / "src" / (folder or "core")
    src.mkdir(parents=True)
    for name in copy:
        path = os.path.join(REPO, folder, name)
        if os.path.isdir(path):
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy(path, src / name)
    out = tmp_path / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    cmd += ["--no-index", "-q", "-w", str(out), str(src)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob(glob)
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


@pytest.mark.processes
def test_the_core_wheel_ships_the_library_and_no_plugin_or_test_code(tmp_path) -> None:
    # plugins/, the harness and tests/ present beside the package, as in the checkout
    copy = [
        "ckptstore",
        "pyproject.toml",
        "README.md",
        "tools/ckptstore-harness",
        "tests",
        "plugins",
    ]
    names = _wheel(tmp_path, "", copy, "ckptstore-*.whl")
    assert "ckptstore/py.typed" in names
    assert "ckptstore/testing/faults.py" in names
    top = {n.split("/")[0] for n in names}
    assert top == {"ckptstore", f"ckptstore-{__version__}.dist-info"}
    assert [
        n for n in names if n.startswith(("ckptstore/integrations/", "ckptstore/plugins/"))
    ] == []
    assert [n for n in names if "lightning" in n or "/hf" in n or "titan" in n] == []
    assert [n for n in names if "/harness/" in n or "/tests/" in n] == []


@pytest.mark.processes
@pytest.mark.parametrize("folder", sorted(PLUGINS))
def test_a_plugin_wheel_ships_its_package_only(tmp_path, folder) -> None:
    dist, package, _extra = PLUGINS[folder]
    names = _wheel(tmp_path, f"plugins/{folder}", ["pyproject.toml", package, "tests"], "*.whl")
    assert f"{package}/__init__.py" in names and f"{package}/py.typed" in names
    top = {n.split("/")[0] for n in names}
    assert top == {package, f"{dist.replace('-', '_')}-{__version__}.dist-info"}
