"""Plugins import only with their framework, name the install command otherwise, and ship
as ``ckptstore.integrations`` through extras."""

import importlib
import os
import re
import shutil
import subprocess
import sys
import zipfile

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
        ("ckptstore.integrations.lightning", "lightning", "lightning"),
        ("ckptstore.integrations.hf", "transformers", "hf"),
        ("ckptstore.integrations.hf", "accelerate", "hf"),
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
    for name in ("ckptstore.integrations", "ckptstore"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.import_module("ckptstore")
    integrations = importlib.import_module("ckptstore.integrations")
    # An ordinary subpackage of ckptstore: no search-path additions.
    assert [os.path.abspath(p) for p in integrations.__path__] == [
        os.path.join(REPO, "ckptstore", "integrations")
    ]


def test_pyproject_declares_the_extras() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert "package-dir" not in project["tool"].get("setuptools", {})
    extras = project["project"]["optional-dependencies"]
    assert any(re.match(r"lightning\b", d) for d in extras["lightning"])
    assert {re.split(r"[<>=!~ \[]", d)[0] for d in extras["hf"]} == {"transformers", "accelerate"}
    # The extras declare the ranges the plugins check at import (integrations/_versions.py).
    from ckptstore.integrations._versions import SUPPORTED

    for name, (spec, extra) in SUPPORTED.items():
        assert f"{name}{spec}" in extras[extra]


@pytest.mark.processes
def test_the_wheel_ships_the_library_and_no_test_code(tmp_path) -> None:
    """Build the wheel offline (setuptools from the venv, no index) from a copy of the sources,
    so the checkout gets no build/ or egg-info, and check what it ships."""
    src = tmp_path / "src"
    shutil.copytree(
        os.path.join(REPO, "ckptstore"),
        src / "ckptstore",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), src / name)
    for name in ("tools/harness", "tests"):  # present beside the package, as in the checkout
        shutil.copytree(
            os.path.join(REPO, name), src / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("ckptstore-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert "ckptstore/py.typed" in names
    assert "ckptstore/testing/faults.py" in names
    for module in ("__init__", "lightning", "hf"):
        assert f"ckptstore/integrations/{module}.py" in names
    top = {n.split("/")[0] for n in names}
    assert top == {"ckptstore", wheel.name.split("-py3")[0] + ".dist-info"}
    assert [n for n in names if n.startswith("ckptstore/plugins/")] == []
    assert [n for n in names if "/harness/" in n or "/tests/" in n] == []
