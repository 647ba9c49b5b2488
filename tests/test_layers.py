"""The import-layer contract in pyproject.toml holds, statically and at run time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.processes
def test_import_linter_contracts_are_kept() -> None:
    """``lint-imports`` (import-linter) with the repository's contracts: every one kept."""
    pytest.importorskip("importlinter")
    # This checkout's ckptstore first; the plugins (root packages too) as installed, or as
    # the caller's PYTHONPATH names them.
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command;"
            " sys.exit(lint_imports_command())",
            "--no-cache",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.processes
def test_torch_free_layers_import_no_torch() -> None:
    """``import ckptstore``, the engine, the stores registry and planning leave torch out."""
    code = (
        "import json, sys, pkgutil, importlib\n"
        "import ckptstore, ckptstore.engine, ckptstore.planning, ckptstore.stores\n"
        "for pkg in (ckptstore.engine, ckptstore.planning):\n"
        "    for m in pkgutil.iter_modules(pkg.__path__):\n"
        "        importlib.import_module(pkg.__name__ + '.' + m.name)\n"
        "import ckptstore.manager.prune, ckptstore.manager.retention\n"
        "torch = [n for n in sys.modules if n == 'torch' or n.startswith('torch.')]\n"
        "print(json.dumps(sorted(torch)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_every_module_docs_architecture_names_exists() -> None:
    """docs/ARCHITECTURE.md stays true to the tree: each ``layer/module.py`` it names is there."""
    import re

    with open(os.path.join(REPO, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
        text = f.read()
    named = set(re.findall(r"`((?:ckptstore/)?(?:[a-z_]+/)+[a-z_]+\.py)`", text))
    named |= set(re.findall(r"\b((?:manager|engine|dcp|stores|cli|data)/[a-z_]+\.py)\b", text))
    assert len(named) > 20
    missing = [
        p
        for p in sorted(named)
        if not any(os.path.exists(os.path.join(REPO, *base, p)) for base in ((), ("ckptstore",)))
        and not p.startswith(("mypkg/", "tests/", "engine/test_", "dcp/test_"))
    ]
    assert missing == []


#: What ``ckptstore.cli`` may import of ckptstore besides its own modules: the public API
#: (pyproject.toml's contract "the cli imports only the public API and ckptstore.format"
#: forbids the rest by name; this keeps a package added later out too).
CLI_MAY_IMPORT = (
    "ckptstore",
    "ckptstore.format",
    "ckptstore.errors",
    "ckptstore.config",
    "ckptstore.stores",
    "ckptstore.data",
    "ckptstore.redact",
    "ckptstore.planning",
)


def test_cli_imports_only_the_public_api() -> None:
    """Every ``ckptstore`` import in ``ckptstore/cli`` (at module level or in a function)
    names a public module: ``ckptstore.planning``'s calculators with their modules, the
    others as packages or modules of their own, never a module inside them."""
    import ast

    cli = os.path.join(REPO, "ckptstore", "cli")
    found: dict[str, set[str]] = {}
    for name in sorted(os.listdir(cli)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(cli, name), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            for m in modules:
                if m.split(".")[0] == "ckptstore" and not m.startswith("ckptstore.cli"):
                    found.setdefault(m, set()).add(name)
    allowed = set(CLI_MAY_IMPORT)
    bad = {
        m: sorted(files)
        for m, files in found.items()
        if m not in allowed and not m.startswith("ckptstore.planning.")
    }
    assert bad == {}
    assert "ckptstore.format" in found
