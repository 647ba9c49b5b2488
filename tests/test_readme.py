"""Every code block of README.md does what the README says, run exactly as written.

Each ```python block runs unchanged in a fresh subprocess, in its own temporary working
directory, with this checkout on PYTHONPATH. A block that talks to an object store gets a
real server from the session fixtures and, through the environment, the credentials the
block reads (as a user's environment would hold them); its bucket is created first. After a
block, the test checks what the README says it leaves behind. The ```bash block of the
torchrun section is checked against the scripts' own argument parsers, and every
``ckptstore-tool`` line against the tool. The ```text blocks are output, not code.

No python block is skipped: ``NOT_RUN`` would list one that cannot run here, with the reason,
and it is empty.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from typing import Any

import pytest

from ckptstore.engine.catalog import list_steps
from ckptstore.stores import open_store

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")

#: python blocks (by their first line in README.md's text) that cannot run here: none.
NOT_RUN: dict[str, str] = {}


def blocks(lang: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of every fenced block of ``lang`` ("" for a bare fence)."""
    with open(README, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.fullmatch(r"```(\w*)\s*", lines[i])
        if not m:
            i += 1
            continue
        start, body = i + 1, []
        i += 1
        while not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        if m.group(1) == lang:
            out.append((start + 1, "\n".join(body) + "\n"))
    return out


PYTHON = blocks("python")


def run_block(code: str, cwd: str, env: dict[str, str] | None = None) -> str:
    full_env = dict(os.environ, PYTHONPATH=REPO, **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"README block failed:\n{code}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def committed(url: str, options: dict[str, Any] | None = None) -> list[int]:
    return [e.step for e in list_steps(open_store(url, options)) if e.status == "committed"]


def store_env(code: str, request: pytest.FixtureRequest) -> tuple[dict[str, str], Any]:
    """The environment an object-store block reads, with its bucket created; (env, check)."""
    if "s3://my-bucket" in code:
        server = request.getfixturevalue("seaweedfs")
        server.create_bucket("my-bucket")
        opts = server.storage_options
        env = {
            "AWS_ACCESS_KEY_ID": opts["key"],
            "AWS_SECRET_ACCESS_KEY": opts["secret"],
            "AWS_ENDPOINT_URL": opts["endpoint_url"],
        }
        return env, lambda: committed("s3://my-bucket/run1", opts)
    if "gs://my-bucket" in code:
        server = request.getfixturevalue("fake_gcs_server")
        server.create_bucket("my-bucket")
        env = {
            "GCS_TOKEN": "anon",
            "STORAGE_EMULATOR_HOST": server.endpoint,
            # fake-gcs-server: without it gcsfs makes a 60 s call per open
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }
        return env, lambda: committed("gs://my-bucket/run1", server.storage_options)
    if "az://my-container" in code:
        server = request.getfixturevalue("azurite_server")
        server.create_bucket("my-container")
        env = {"AZURE_STORAGE_CONNECTION_STRING": server.connection_string()}
        return env, lambda: committed("az://my-container/run1", server.storage_options)
    raise AssertionError("not an object-store block")


def block_id(block: tuple[int, str]) -> str:
    return f"line{block[0]}"


def marks(block: tuple[int, str]) -> list[Any]:
    return [pytest.mark.server] if re.search(r'"(s3|gs|az)://my-', block[1]) else []


@pytest.mark.parametrize("block", [pytest.param(b, id=block_id(b), marks=marks(b)) for b in PYTHON])
@pytest.mark.processes
def test_python_block_runs_as_written(block: tuple[int, str], tmp_path, request) -> None:
    line, code = block
    first = code.strip().splitlines()[0]
    assert first not in NOT_RUN
    cwd = str(tmp_path)
    if re.search(r'"(s3|gs|az)://my-', code):
        env, check = store_env(code, request)
        run_block(code, cwd, env)
        assert check() == [100]
    elif "CheckpointManager(\n" in code and "checkpoints/run2" in code:  # the resume loop
        run_block(code, cwd)
        assert committed(os.path.join(cwd, "checkpoints/run2")) == [5, 10, 15]  # KeepLast(3)
        run_block(code, cwd)  # "Run it again and it resumes after step 15"
        assert committed(os.path.join(cwd, "checkpoints/run2")) == [5, 10, 15]
    elif "checkpoints/data-run" in code:
        run_block(code, cwd)  # the block asserts the resumed batch itself
        assert committed(os.path.join(cwd, "checkpoints/data-run")) == [2]
    elif "checkpoints/run1/step_000000100" in code:  # the script example
        out = run_block(code, cwd)
        assert committed(os.path.join(cwd, "checkpoints/run1")) == [100, 200]
        assert out.count("torch.distributed is disabled") == 2  # stock dcp.save/load only
        again = code[code.index("ckptstore.save(state_dict") :]  # "... raises ..."
        retry = "import torch, ckptstore\nstate_dict = {'weights': torch.ones(2)}\n" + again
        proc = subprocess.run(
            [sys.executable, "-c", retry],
            cwd=cwd,
            env=dict(os.environ, PYTHONPATH=REPO),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 1 and "CheckpointExistsError" in proc.stderr
    else:
        raise AssertionError(f"README.md line {line}: a python block this test does not know")


def test_every_python_block_is_run() -> None:
    known = ("my-bucket", "my-container", "checkpoints/run2", "data-run", "run1/step_000000100")
    assert len(PYTHON) == 6
    assert all(any(k in code for k in known) for _, code in PYTHON)


def _help(script: str) -> str:
    proc = subprocess.run(
        [sys.executable, script, "--help"],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.processes
def test_torchrun_block_matches_the_scripts_and_needs_no_environment() -> None:
    (_, code), _multinode, *rest = blocks("bash")
    assert not rest
    lines = code.replace("\\\n", " ").strip().splitlines()
    assert len(lines) == 2
    tokens, launch = (shlex.split(x) for x in lines)
    assert "=" not in tokens[0] and "=" not in launch[0]  # no VAR=value prefix
    assert tokens[:2] == [".venv/bin/python", "examples/resilience/tokens.py"]
    assert launch[0] == ".venv/bin/torchrun" and os.path.exists(os.path.join(REPO, launch[0]))
    script = launch.index("examples/resilience/train.py")
    assert launch[1:script] == ["--nproc-per-node", "2", "--max-restarts", "3"]
    train_help = _help(os.path.join(REPO, launch[script]))
    for flag in (t for t in launch[script + 1 :] if t.startswith("--")):
        assert flag in train_help
    assert tokens[2] == launch[launch.index("--data") + 1]  # the dataset it wrote
    _help(os.path.join(REPO, tokens[1]))


@pytest.mark.processes
def test_the_demo_script_starts_as_make_demo_runs_it() -> None:
    """``make demo`` runs ``python tools/demo.py``: its folder comes first on ``sys.path``,
    where nothing may shadow the installed harness (a ``tools/harness`` folder once did)."""
    proc = subprocess.run(
        [sys.executable, "tools/demo.py", "--help"],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage: demo.py" in proc.stdout


def test_multinode_torchrun_block_names_a_registered_backend() -> None:
    """The several-nodes line parses as torchrun's own arguments, and the backend it names
    is one torchrun's registry makes (the entry point ckptstore installs)."""
    import torch.distributed.elastic.rendezvous.registry as registry
    from torch.distributed.run import get_args_parser

    from ckptstore.rendezvous import BACKEND

    _, (_, code), *_ = blocks("bash")
    (line,) = code.replace("\\\n", " ").strip().splitlines()
    tokens = shlex.split(line)
    assert tokens[0] == "torchrun"
    args = get_args_parser().parse_args(tokens[1:])
    assert args.rdzv_backend == BACKEND
    registry._register_out_of_tree_handlers()  # what torchrun does at start
    assert BACKEND in registry.handler_registry._registry


def tool_lines() -> list[str]:
    """The ``ckptstore-tool ...`` lines of README.md's bare code blocks, descriptions cut."""
    out = []
    for _, code in blocks(""):
        for line in code.splitlines():
            if line.startswith("ckptstore-tool "):
                parts = re.split(r"\s{3,}", line.strip())
                if len(parts) > 1 and parts[-1][0].islower():
                    parts.pop()  # the description column
                out.append(" ".join(parts))
    return out


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckptstore.cli", *args],
        env=dict(os.environ, PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.processes
def test_every_ckptstore_tool_line_parses() -> None:
    lines = tool_lines()
    assert len(lines) == 8
    for line in lines:
        argv = [a.strip("[]") for a in shlex.split(line)[1:]]
        r = tool(argv[0], "--help")
        assert r.returncode == 0, f"{line}: {r.stderr}"
        for flag in (a.split("=")[0] for a in argv if a.startswith("--")):
            assert flag in r.stdout, f"{line}: {flag} is not an option of {argv[0]}"
        if all(a.startswith("--") or a[0].isdigit() for a in argv[1:]):  # runs as written
            r = tool(*argv)
            assert r.returncode == 0 and "Goodput (first-order model)" in r.stdout, r.stderr


@pytest.mark.distributed
@pytest.mark.slow
def test_the_resume_loop_runs_under_torchrun_after_init_process_group(tmp_path) -> None:
    """ "Under torchrun the same code runs on every rank once
    ckptstore.launch.init_process_group has been called": the block, preceded by that call,
    on 2 ranks under stock torchrun."""
    (code,) = [c for _, c in PYTHON if "checkpoints/run2" in c]
    script = tmp_path / "loop.py"
    script.write_text('import ckptstore\nckptstore.launch.init_process_group("gloo")\n' + code)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = subprocess.run(
        [torchrun, "--nproc-per-node", "2", str(script)],
        cwd=str(tmp_path),
        env=dict(os.environ, PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert committed(str(tmp_path / "checkpoints/run2")) == [5, 10, 15]
