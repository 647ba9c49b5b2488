"""The top-level ``ckptstore`` names: all resolve, and the exported errors are one list."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

import ckptstore
from ckptstore import errors

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_name_in_all_resolves() -> None:
    assert [n for n in ckptstore.__all__ if not hasattr(ckptstore, n)] == []
    assert len(set(ckptstore.__all__)) == len(ckptstore.__all__)
    assert set(ckptstore.__all__) <= set(dir(ckptstore))


def test_exported_errors_are_errors_checkpoint_errors() -> None:
    exported = [n for n in ckptstore.__all__ if n.endswith("Error")]
    assert exported == errors.CHECKPOINT_ERRORS
    for name in exported:
        assert getattr(ckptstore, name) is getattr(errors, name)
        assert issubclass(getattr(errors, name), errors.CkptStoreError)
    assert not hasattr(ckptstore, "CacheTooSmallError")  # the data layer's stay in errors


#: The torch-free names for working with a root without DCP, and where each lives.
ROOT_TOOLS = {
    "Store": "ckptstore.engine.store",
    "open_store": "ckptstore.stores",
    "TransferEngine": "ckptstore.engine.transfer",
    "open_committed": "ckptstore.engine.committed",
    "checkpoint_status": "ckptstore.engine.committed",
    "committed_steps": "ckptstore.engine.catalog",
    "list_steps": "ckptstore.engine.catalog",
    "verify_checkpoint": "ckptstore.engine.verify",
    "copy_checkpoint": "ckptstore.engine.copy",
    "plan_prune": "ckptstore.manager.prune",
    "apply_prune": "ckptstore.manager.prune",
}


def test_root_tools_are_public_and_the_library_objects() -> None:
    for name, module in ROOT_TOOLS.items():
        assert name in ckptstore.__all__
        assert getattr(ckptstore, name) is getattr(importlib.import_module(module), name)
        assert getattr(ckptstore, name).__doc__


@pytest.mark.processes
def test_import_ckptstore_and_its_root_tools_import_no_torch() -> None:
    names = ", ".join(repr(n) for n in ROOT_TOOLS)
    code = (
        "import json, sys, ckptstore\n"
        "before = 'torch' in sys.modules\n"
        f"for name in ({names}):\n"
        "    getattr(ckptstore, name)\n"
        "print(json.dumps([before, 'torch' in sys.modules]))\n"
    )
    env = {**os.environ, "PYTHONPATH": REPO}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [False, False]


def test_root_tools_on_a_local_root(tmp_path) -> None:
    """The documented sequence on an empty root: nothing committed, nothing to prune."""
    root = ckptstore.open_store(str(tmp_path))
    assert isinstance(root, ckptstore.Store)
    assert list(ckptstore.committed_steps(root)) == []
    assert ckptstore.checkpoint_status(root.child("step_000000001")) == "incomplete"
    plan = ckptstore.plan_prune(root, ckptstore.KeepLast(1))
    assert plan.steps == [] and plan.uploads == []
    ckptstore.apply_prune(root, plan)
    assert list(tmp_path.iterdir()) == []
