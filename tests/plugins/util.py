"""Helpers the plugins' tests share (plugins/*/tests/; no framework imports here)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import torch

from ckptstore.engine.catalog import list_steps, step_name
from ckptstore.stores import open_store

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pythonpath() -> str:
    """This checkout first (its ckptstore), then whatever this process was given."""
    return os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)


def statuses(root: str) -> dict[int, str]:
    return {e.step: e.status for e in list_steps(open_store(root))}


def committed(root: str) -> list[int]:
    return [s for s, status in statuses(root).items() if status == "committed"]


def run_killed(script: str, args: list[str], crash_at: str) -> subprocess.CompletedProcess:
    """Run the job script at path ``script``; ckptstore kills it -9 at the named crash point."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTSTORE_CRASH")}
    env.update(
        PYTHONPATH=_pythonpath(),
        OMP_NUM_THREADS="1",
        CKPTSTORE_CRASH_AT=crash_at,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    return subprocess.run(
        [sys.executable, script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def assert_equal_tree(a: Any, b: Any, where: str = "") -> None:
    """Bitwise equality of nested dicts/lists of tensors and plain values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            assert_equal_tree(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal_tree(x, y, f"{where}/{i}")
    else:
        assert a == b, (where, a, b)


def flip_tail(path: str, n: int = 8) -> None:
    """Corrupt the last ``n`` bytes of a local file."""
    with open(path, "r+b") as f:
        f.seek(-n, 2)
        data = f.read(n)
        f.seek(-n, 2)
        f.write(bytes(b ^ 0xFF for b in data))


def damage_shard(root: str, step: int) -> None:
    """Flip bytes at the end of a committed step's data file, through the store API."""
    ckpt = open_store(root).child(step_name(step))
    name = next(n for n in ckpt.listdir() if n.endswith(".distcp"))
    data = bytearray(ckpt.get(name))
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])
    ckpt.put(name, bytes(data))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(
    argv: list[str],
    torchrun: int | None = None,
    accelerate: int | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """Run a job script (``argv[0]``, its path) without inherited crash points.

    ``torchrun=N`` starts it under ``torchrun --standalone --nproc-per-node N``,
    ``accelerate=N`` under ``accelerate launch --multi_gpu --num_processes N``; otherwise it runs
    as a plain script (and may start its own ranks, as Lightning's launcher does).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTSTORE_CRASH")}
    env.update(
        PYTHONPATH=_pythonpath(),
        OMP_NUM_THREADS="1",
        MASTER_ADDR="127.0.0.1",
        GLOO_SOCKET_IFNAME="lo",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    script = list(argv)
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node", str(torchrun), *script]
    elif accelerate:
        # --multi_gpu picks Accelerate's torchrun launcher; the script's Accelerator(cpu=True)
        # makes each process a CPU gloo rank (--cpu would start one process).
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu"]
        cmd += ["--num_machines", "1", "--num_processes", str(accelerate)]
        cmd += ["--main_process_port", str(free_port())]
        cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", *script]
    else:
        cmd = [sys.executable, *script]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


#: The options a trainer plugin refuses (``ManagerOptions.refuse_cadences``).
CADENCES = ("local_every", "root_every")


def every_manager_option(tmp_path: Any) -> dict[str, Any]:
    """A valid value, other than the default, for every field of ``ManagerOptions``; fails
    naming a field added since, so its test is extended (the plugins need no edit). A
    plugin takes every one but ``CADENCES``."""
    import dataclasses

    from ckptstore import KeepLast, ManagerOptions, TransferConfig, WriterOptions

    values = {
        "storage_options": {"anon": True},
        "local_tier_dir": str(tmp_path / "local-tier"),
        "keep": KeepLast(7),
        "writer": WriterOptions("zstd", "spread", TransferConfig(concurrency=3)),
        "async_save": False,
        "on_busy": "skip",
        "strict": True,
        "grace_period_s": 7.5,
        "handle_sigterm": True,
        "background": "process",
        "allow_pickle": True,
        "max_staging_bytes": 1 << 20,
        "defer_staging": False,
        "run_id": "run-7",
        "replicas": 2,
        "replica_rate": 1 << 20,
        "tier_limit": 1 << 30,
        "root_every": 2,
        "local_every": 3,
        "keep_local": 2,
    }
    fields = {f.name for f in dataclasses.fields(ManagerOptions)}
    assert set(values) == fields, f"give every_manager_option a value for {fields ^ set(values)}"
    default = ManagerOptions()
    assert [n for n, v in values.items() if getattr(default, n) == v] == []
    return values


class ManagerSpy:
    """Stands in for ``CheckpointManager`` in a plugin: records the options it is made with."""

    made: list[ManagerSpy] = []

    def __init__(self, root: Any, options: Any = None, **keywords: Any) -> None:
        from ckptstore import ManagerOptions

        self.root = root
        self.options = ManagerOptions.from_keywords(options, **keywords)
        ManagerSpy.made.append(self)


def assert_refuses_wrong_options(make: Any) -> None:
    """``make(**keywords)`` refuses an option given under its old and its new name, an
    unknown and an invalid manager option at once, as ``CheckpointManager`` does."""
    import pytest

    from ckptstore.errors import ConfigError

    with pytest.raises(ConfigError, match="'staging_dir' is its old name"):
        make(staging_dir="/nvme", local_tier_dir="/nvme")
    with pytest.raises(ConfigError, match="unknown CheckpointManager option 'nope'.*writer"):
        make(nope=1)
    with pytest.raises(ConfigError, match="on_busy"):
        make(on_busy="later")
