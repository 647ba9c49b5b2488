"""Every subcommand through the real console script (a subprocess per run).

Each run pays Python + torch start-up (several seconds), so these tests check what only a
real process shows: exit codes, stdout/stderr separation, one-line errors without a
traceback, and Ctrl-C during ``cp``. Behaviour in depth is in ``test_commands.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from ckptstore.engine.committed import open_committed
from ckptstore.engine.manifest import MARKER_NAME
from tests.cli.conftest import REPO, Backend, run_script, sample_state, save_ckpt, script_env

SLOW_CLI = os.path.join(REPO, "tests", "cli", "slow_cli.py")


def no_traceback(err: str) -> bool:
    return "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.processes
def test_ls_and_missing_root(backend: Backend, root_url: str, script) -> None:
    save_ckpt(backend, root_url + "/step_000000010")
    r = script("ls", root_url)
    assert r.rc == 0 and "10  committed" in r.out and r.err == ""
    r = script("ls", backend.missing)
    assert r.rc == 2 and r.out == "" and "nothing at" in r.err and no_traceback(r.err)


@pytest.mark.processes
def test_inspect_incomplete_says_so(backend: Backend, root_url: str, script) -> None:
    url = save_ckpt(backend, root_url + "/step_000000010")
    backend.open(url).delete(MARKER_NAME)
    r = script("inspect", url, "--json")
    assert r.rc == 0 and '"status": "incomplete"' in r.out


@pytest.mark.processes
def test_verify_corrupt_shard_exits_1(backend: Backend, root_url: str, script) -> None:
    url = save_ckpt(backend, root_url + "/step_000000010")
    store = backend.open(url)
    r = max(open_committed(store).manifest.ranges, key=lambda r: r.length)
    data = bytearray(store.get(r.file))
    data[r.offset + 10] ^= 0x01
    store.put(r.file, bytes(data))
    res = script("verify", url)
    assert res.rc == 1 and f"bytes [{r.offset}, {r.offset + r.length})" in res.out


@pytest.mark.processes
def test_convert_to_safetensors_replaces_with_force(
    backend: Backend, root_url: str, script
) -> None:
    url = save_ckpt(backend, root_url + "/step_000000010")
    dst = root_url + "/model.safetensors"
    backend.open(root_url).put("model.safetensors", b"old")
    r = script("convert", url, dst, "--to", "safetensors", "--drop-objects", "--force")
    assert r.rc == 0 and "verified" in r.out, r.err
    from safetensors.torch import load

    got = load(backend.open(root_url).get("model.safetensors"))
    assert torch.equal(got["model.w"], sample_state()["model"]["w"])


@pytest.mark.processes
def test_cp_interrupted_commits_nothing_then_completes(backend: Backend, root_url: str) -> None:
    """SIGINT mid-copy (slowed by tests/cli/slow_cli.py): nothing committed at DST."""
    dst_url = root_url + "/copy/step_000000010"
    dst = backend.open(dst_url)
    # 2 files of 2 tensors, each file over 2 parts even where parts are >= 5 MiB (S3), so
    # the copy is a set of slowed multipart uploads: 2 MiB files on a volume, 5.5 on S3.
    cols = max(1024, dst.capabilities.min_part_size // 2048 + 256)
    state = {f"w{i}": torch.randn(256, cols) for i in range(4)}
    src = save_ckpt(backend, root_url + "/step_000000010", state, files_per_rank=2)
    args = ["cp", src, dst_url, *backend.opts]
    slow = [sys.executable, SLOW_CLI, "put_part=1.0", *args, "--part-size-mib", "0.25"]
    proc = subprocess.Popen(
        [*slow, "--concurrency", "2"],
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell's background job (`cmd &`) inherits SIGINT ignored, and Python then never
        # raises KeyboardInterrupt: give the CLI the disposition a terminal user's has
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 90
        while not (dst.list_multipart() or dst.find()):  # the first upload has begun
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the copy never started"
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "no committed checkpoint" in err
    assert not dst.exists(MARKER_NAME)
    assert dst.find() == [] and dst.list_multipart() == []
    if os.path.isabs(dst_url):  # a volume: the step directory the copy made is gone too
        assert not os.path.lexists(dst_url)
    # the same copy, not interrupted, completes and commits
    base = [sys.executable, "-m", "ckptstore.cli", *args]
    done = subprocess.run(base, env=script_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "committed" in done.stdout, done.stderr
    assert dst.exists(MARKER_NAME)


@pytest.mark.processes
def test_gc_deletes_all_but_the_newest(backend: Backend, root_url: str, script) -> None:
    for n in (1, 2, 3):
        save_ckpt(backend, f"{root_url}/step_{n:09d}")
    r = script("gc", root_url, "--keep-last", "1")
    assert r.rc == 0 and "deleted 2 checkpoints" in r.out
    assert [n for n in backend.open(root_url).listdir() if n.startswith("step_")] == [
        "step_000000003"
    ]


@pytest.mark.processes
def test_storage_commands_start_without_torch(backend: Backend, root_url: str) -> None:
    """ls, verify, cp and gc never load a tensor, so they never import torch (seconds)."""
    url = save_ckpt(backend, root_url + "/step_000000010")
    commands = [
        ["ls", root_url],
        ["verify", url],
        ["cp", url, root_url + "/copy/step_000000010"],
        ["gc", root_url, "--keep-last", "1", "--dry-run"],
    ]
    code = (
        "import json, sys\n"
        "from ckptstore.cli.main import main\n"
        "rcs = [main(argv) for argv in json.loads(sys.argv[1])]\n"
        "print(json.dumps({'rcs': rcs, 'torch': 'torch' in sys.modules}))\n"
    )
    argv = json.dumps([[*c, *backend.opts] for c in commands])
    proc = subprocess.run(
        [sys.executable, "-c", code, argv],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"rcs": [0, 0, 0, 0], "torch": False}


@pytest.mark.processes
def test_diff_exit_codes(backend: Backend, root_url: str, script) -> None:
    a = save_ckpt(backend, root_url + "/a")
    b = save_ckpt(backend, root_url + "/b", sample_state(seed=1))
    r = script("diff", a, b)
    assert r.rc == 1 and "model.w  differs" in r.out


@pytest.mark.processes
def test_goodput_mission_figure() -> None:
    r = run_script("goodput", "--failures-per-day", "8.6", "--interval-min", "30")
    line = next(x for x in r.out.splitlines() if x.startswith("Goodput (first-order model)"))
    assert r.rc == 0 and line.split()[-2] == "91.0"


@pytest.mark.processes
def test_console_script_entry_point() -> None:
    with open(os.path.join(REPO, "pyproject.toml")) as f:
        assert 'ckptstore-tool = "ckptstore.cli.main:main"' in f.read()
    from ckptstore.cli.main import main

    assert main(["--version"]) == 0
    exe = shutil.which("ckptstore-tool", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("ckptstore-tool is not installed in this environment")
    r = subprocess.run([exe, "--help"], env=script_env(), capture_output=True, text=True)
    assert r.returncode == 0 and "exit codes" in r.stdout and "goodput" in r.stdout
