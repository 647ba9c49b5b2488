"""Trust rule 3: every size read from storage is bounded before it is trusted.

Each case is a file an attacker who can write the bucket can make (re-signed where the
checkpoint has a manifest): a zstd bomb item (ckptstore's and stock ``stream.zstd/1``), a
1 GiB marker, manifests many times what their marker commits, a ``.metadata`` whose
planner data names one list ~10^9 times in a few KB, a ``.metadata`` claiming a petabyte
tensor, and two NumPy RNG-state pickles (an object array that crashes NumPy, a 65-byte
one asking for gigabytes). Each is loaded in a child process, through the reader, a
``CheckpointManager.restore`` (which must fall back to the previous step) and the CLI; the
child reports the error, the time taken and how far its peak RSS grew (``VmHWM`` after
``clear_refs``), and the test asserts a ``CorruptCheckpointError`` (exit 1 from the CLI)
within seconds and a bounded growth.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemWriter, _StorageInfo

import ckptstore
from ckptstore import WriterOptions
from ckptstore.engine.checksum import crc32c, format_crc
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, Marker
from ckptstore.manager import CheckpointManager
from ckptstore.manager.state import RNGState

REPO = str(Path(ckptstore.__file__).resolve().parents[1])  # the checkout under test
#: Peak RSS growth allowed for one load of a crafted file (the attacks ask for GiBs).
BOUND_MB = 150
#: Seconds one load of a crafted file may take (a clear error, not a long walk).
SECONDS = 20

# -- crafted files --------------------------------------------------------------------------


def zstd_bomb(nbytes: int) -> bytes:
    """One zstd frame recording no size (as DCP's stream extension writes) that decodes to
    ``nbytes`` zero bytes: ~32 KB per GiB."""
    import zstandard

    out = io.BytesIO()
    w = zstandard.ZstdCompressor(write_content_size=False).stream_writer(out, closefd=False)
    piece = bytes(1 << 20)
    for _ in range(nbytes >> 20):
        w.write(piece)
    w.close()
    return out.getvalue()


def _g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _s(text: str) -> bytes:
    return b"X" + len(text).to_bytes(4, "little") + text.encode()


_RNG_TAIL = b"K\x00K\x00G" + bytes(8) + b"t."  # pos 0, has_gauss 0, gauss 0.0, end of tuple


def rng_object_array() -> bytes:
    """('MT19937', an object-dtype array of 624 Nones, 0, 0, 0.0) through the globals an RNG
    state may name: NumPy 2.4 segfaults on it in ``np.random.set_state``."""
    reconstruct = _g("numpy._core.multiarray", "_reconstruct") + _g("numpy", "ndarray")
    dtype = (
        _g("numpy", "dtype")
        + _s("O8")
        + b"\x89\x88\x87R(K\x03"
        + _s("|")
        + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK?tb"
    )
    array = reconstruct + b"K\x00\x85C\x01b\x87R(K\x01Mp\x02\x85" + dtype + b"\x89](NNNNetb"
    return b"\x80\x02(" + _s("MT19937") + array + _RNG_TAIL


def rng_huge_void(nbytes: int) -> bytes:
    """('MT19937', numpy.ndarray((1,), 'V<nbytes>'), 0, 0, 0.0): 65 bytes that make NumPy
    allocate (and fill) ``nbytes`` several times over."""
    array = _g("numpy", "ndarray") + b"K\x01\x85" + _s(f"V{nbytes}") + b"\x86R"
    return b"\x80\x02(" + _s("MT19937") + array + _RNG_TAIL


def shared_planner_data(levels: int = 3, width: int = 1000) -> Any:
    """A list naming the one list below it ``width`` times, ``levels`` deep: a few KB of
    pickle, ``width ** levels`` references."""
    node: Any = ["x"]
    for _ in range(levels):
        node = [node] * width
    return node


def _resign(step_dir: Path, doc: dict[str, Any]) -> None:
    """Write manifest ``doc`` (canonical and attempt copy) and a marker committing it."""
    data = json.dumps(doc).encode()
    old = json.loads((step_dir / MARKER_NAME).read_bytes())
    for p in step_dir.glob("ckptstore.manifest*.json"):
        p.write_bytes(data)
    marker = Marker.for_manifest(data, old["step"], old["attempt"])
    (step_dir / MARKER_NAME).write_bytes(marker.to_bytes())


def resign_metadata(step_dir: Path, md: Any, extra_files: dict[str, bytes] | None = None) -> None:
    """Write ``md`` as ``.metadata`` (every copy), add ``extra_files``, re-sign all."""
    doc = json.loads((step_dir / MANIFEST_NAME).read_bytes())
    for name, data in (extra_files or {}).items():
        (step_dir / name).write_bytes(data)
        doc["files"][name] = {"size": len(data), "crc32c": format_crc(crc32c(data))}
        doc["ranges"].append(
            {"file": name, "offset": 0, "length": len(data), "crc32c": format_crc(crc32c(data))}
        )  # no raw_length: the decoder has only the item's own size to go by
    data = pickle.dumps(md)
    for p in step_dir.glob(".metadata*"):
        p.write_bytes(data)
    doc["files"][".metadata"] = {"size": len(data), "crc32c": format_crc(crc32c(data))}
    _resign(step_dir, doc)


def _metadata(step_dir: Path) -> Any:
    return pickle.loads((step_dir / ".metadata").read_bytes())


def _info_of(md: Any, fqn: str) -> tuple[Any, Any]:
    return next((i, v) for i, v in md.storage_data.items() if i.fqn == fqn)


def two_steps(root: Path, codec: str = "none") -> Path:
    """A root with committed steps 1 and 2 of ``{"w": 64 floats, "n": step}``; step 2's dir."""
    with CheckpointManager(
        str(root), writer=WriterOptions(codec=codec), background="thread"
    ) as mgr:
        for step in (1, 2):
            mgr.save(step, {"w": torch.full((64,), float(step)), "n": step})
    return root / "step_000000002"


# -- the child that loads them --------------------------------------------------------------

_CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import torch, ckptstore
from ckptstore.manager import CheckpointManager
from ckptstore.manager.state import RNGState
from ckptstore.cli.main import main

def kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])

def run(kind, arg):
    if kind == "reader":
        r = ckptstore.reader(arg)
        dcp_state = {"w": torch.zeros(64), "n": 0}
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        from ckptstore.dcp.save_load import unwrap_checkpoint_exception
        try:
            dcp.load(dcp_state, storage_reader=r, no_dist=True)
        except CheckpointException as exc:
            raise unwrap_checkpoint_exception(exc) from None
        return "loaded"
    if kind == "restore":
        state = {"w": torch.zeros(64), "n": 0}
        if arg.get("rng"):
            state["rng"] = RNGState()
        with CheckpointManager(arg["root"]) as mgr:
            return [mgr.restore(state), state["n"]]
    if kind == "cli":
        return main(arg)
    raise ValueError(kind)

out = []
for kind, arg in json.loads(sys.argv[1]):
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
    base, t0 = kb("VmRSS:"), time.monotonic()
    try:
        res = {"result": run(kind, arg)}
    except BaseException as exc:
        res = {"error": type(exc).__name__, "message": str(exc)[:300]}
    res.update(kind=kind, seconds=time.monotonic() - t0, growth_mb=(kb("VmHWM:") - base) / 1024)
    out.append(res)
    print("RESULT " + json.dumps(res), flush=True)
"""


def in_child(steps: list[tuple[str, Any]], timeout: float = 120) -> list[dict[str, Any]]:
    """Run ``steps`` (("reader", url) / ("restore", {"root": ...}) / ("cli", argv)) in a
    fresh Python with this checkout first on its path; each step's result."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(steps)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    results = [
        json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")
    ]
    assert len(results) == len(steps), (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    return results


def assert_bounded(res: dict[str, Any]) -> None:
    assert res["seconds"] < SECONDS, res
    assert res["growth_mb"] < BOUND_MB, res


def assert_corrupt(res: dict[str, Any], match: str = "") -> None:
    assert res.get("error") == "CorruptCheckpointError", res
    assert match in res["message"], res
    assert_bounded(res)


def assert_fell_back(res: dict[str, Any]) -> None:
    assert res.get("result") == [1, 1], res  # step 1 restored, step 2 refused
    assert_bounded(res)


def assert_cli_corrupt(res: dict[str, Any]) -> None:
    assert res.get("result") == 1, res  # exit 1: damage found (not 3, an internal error)
    assert_bounded(res)


# -- the cases ------------------------------------------------------------------------------


@pytest.mark.processes
def test_zstd_bomb_in_a_ckptstore_checkpoint(tmp_path: Path) -> None:
    step_dir = two_steps(tmp_path / "root", codec="zstd")
    md = _metadata(step_dir)
    index, _ = _info_of(md, "w")
    bomb = zstd_bomb(2 << 30)
    md.storage_data[index] = _StorageInfo("bomb.distcp", 0, len(bomb), ["stream.zstd/1"])
    resign_metadata(step_dir, md, {"bomb.distcp": bomb})
    url = f"file://{step_dir}"
    out = tmp_path / "out.pt"
    reader, restore, cli = in_child(
        [
            ("reader", url),
            ("restore", {"root": str(tmp_path / "root")}),
            ("cli", ["convert", url, str(out), "--to", "torch"]),
        ]
    )
    assert_corrupt(reader, "more than")
    assert_fell_back(restore)
    assert_cli_corrupt(cli)
    assert not out.exists()


@pytest.mark.processes
def test_zstd_bomb_in_a_stock_checkpoint(tmp_path: Path) -> None:
    from torch.distributed.checkpoint._extension import ZStandard

    d = tmp_path / "stock"
    state = {"w": torch.ones(64), "n": 1}
    dcp.save(
        state, storage_writer=FileSystemWriter(str(d), _extensions=[ZStandard()]), no_dist=True
    )
    md = _metadata(d)
    index, info = _info_of(md, "w")
    bomb = zstd_bomb(2 << 30)
    shard = d / info.relative_path
    end = shard.stat().st_size
    with shard.open("ab") as f:
        f.write(bomb)
    md.storage_data[index] = _StorageInfo(info.relative_path, end, len(bomb), ["stream.zstd/1"])
    (d / ".metadata").write_bytes(pickle.dumps(md))
    reader, convert, transcode = in_child(
        [
            ("reader", f"file://{d}"),
            ("cli", ["convert", str(d), str(tmp_path / "o.pt"), "--to", "torch"]),
            ("cli", ["convert", str(d), str(tmp_path / "o"), "--to", "dcp"]),
        ]
    )
    assert_corrupt(reader, "more than")
    assert_cli_corrupt(convert)
    assert_cli_corrupt(transcode)


@pytest.mark.processes
def test_a_huge_marker_is_refused_unread(tmp_path: Path) -> None:
    step_dir = two_steps(tmp_path / "root")
    with (step_dir / MARKER_NAME).open("r+b") as f:
        f.truncate(1 << 30)  # a 1 GiB marker (sparse: no disk)
    reader, restore, cli = in_child(
        [
            ("reader", f"file://{step_dir}"),
            ("restore", {"root": str(tmp_path / "root")}),
            ("cli", ["verify", str(step_dir)]),
        ]
    )
    assert_corrupt(reader, "larger than")
    assert_fell_back(restore)
    assert_cli_corrupt(cli)


@pytest.mark.processes
def test_manifests_bigger_than_the_marker_commits_are_refused_unread(tmp_path: Path) -> None:
    step_dir = two_steps(tmp_path / "root")
    for p in step_dir.glob("ckptstore.manifest*.json"):
        with p.open("r+b") as f:
            f.truncate(768 << 20)  # the marker commits a few KB
    reader, restore, cli = in_child(
        [
            ("reader", f"file://{step_dir}"),
            ("restore", {"root": str(tmp_path / "root")}),
            ("cli", ["verify", str(step_dir)]),
        ]
    )
    assert_corrupt(reader, "does not match")
    assert_fell_back(restore)
    assert_cli_corrupt(cli)


@pytest.mark.processes
def test_a_metadata_naming_one_list_a_billion_times_is_refused_at_once(tmp_path: Path) -> None:
    step_dir = two_steps(tmp_path / "root")
    md = _metadata(step_dir)
    md.planner_data = {**md.planner_data, "w": shared_planner_data()}
    resign_metadata(step_dir, md)
    assert (step_dir / ".metadata").stat().st_size < 16 << 10
    reader, restore, cli = in_child(
        [
            ("reader", f"file://{step_dir}"),
            ("restore", {"root": str(tmp_path / "root")}),
            ("cli", ["diff", str(step_dir), str(step_dir.parent / "step_000000001")]),
        ],
        timeout=90,
    )
    assert_corrupt(reader, "more than once")
    assert_fell_back(restore)
    assert_cli_corrupt(cli)


@pytest.mark.processes
def test_a_metadata_claiming_a_petabyte_tensor_is_refused_before_allocation(
    tmp_path: Path,
) -> None:
    step_dir = two_steps(tmp_path / "root")
    md = _metadata(step_dir)
    md.state_dict_metadata["w"].size = torch.Size([1 << 50])  # 4 PiB of float32
    resign_metadata(step_dir, md)
    one = str(step_dir.parent / "step_000000001")
    reader, restore, convert, diff = in_child(
        [
            ("reader", f"file://{step_dir}"),
            ("restore", {"root": str(tmp_path / "root")}),
            ("cli", ["convert", str(step_dir), str(tmp_path / "o.pt"), "--to", "torch"]),
            ("cli", ["diff", one, str(step_dir)]),
        ]
    )
    assert_corrupt(reader, "a tensor of")
    assert_fell_back(restore)
    assert_cli_corrupt(convert)
    assert_cli_corrupt(diff)


@pytest.mark.parametrize(
    "numpy_state",
    [rng_object_array(), rng_huge_void(400_000_000)],
    ids=["object-array", "huge-void"],
)
@pytest.mark.processes
def test_a_malformed_numpy_rng_state_is_corrupt_and_restore_falls_back(
    tmp_path: Path, numpy_state: bytes
) -> None:
    root = tmp_path / "root"
    good = RNGState().state_dict()
    ckptstore.save({"w": torch.full((64,), 1.0), "n": 1, "rng": good}, f"{root}/step_000000001")
    hostile = {"world_size": 1, "rank0": {**good["rank0"], "numpy": numpy_state}}
    ckptstore.save({"w": torch.full((64,), 2.0), "n": 2, "rng": hostile}, f"{root}/step_000000002")
    (restore,) = in_child([("restore", {"root": str(root), "rng": True})])
    assert_fell_back(restore)


def test_rng_refusals_name_what_is_wrong() -> None:
    from ckptstore.errors import CorruptCheckpointError, UnsafePickleError
    from ckptstore.manager.state import restore_rng

    good = RNGState().state_dict()["rank0"]
    with pytest.raises(CorruptCheckpointError, match="numpy RNG state is malformed"):
        restore_rng({**good, "numpy": rng_huge_void(1 << 40)})
    with pytest.raises(UnsafePickleError, match="not part of an RNG state"):
        restore_rng({**good, "python": pickle.dumps(print)})


def _one_rank_has_a_malformed_rng_state(rank: int, world: int, root: str) -> Any:
    good = RNGState()
    with CheckpointManager(root, background="thread") as mgr:
        mgr.save(1, {"w": torch.full((8,), 1.0), "rng": good})
        if rank == 1:  # only rank 1's stream is hostile in step 2
            hostile = good.state_dict()
            hostile["rank1"] = {**hostile["rank1"], "numpy": rng_huge_void(400_000_000)}
            mgr.save(2, {"w": torch.full((8,), 2.0), "rng": hostile})
        else:
            mgr.save(2, {"w": torch.full((8,), 2.0), "rng": good})
        mgr.wait()
    state = {"w": torch.zeros(8), "rng": RNGState()}
    with (
        CheckpointManager(root, background="thread") as mgr,
        pytest.warns(RuntimeWarning, match="step 2"),
    ):
        step = mgr.restore(state)
    return step, float(state["w"][0])


@pytest.mark.distributed
def test_a_malformed_rng_state_on_one_rank_makes_every_rank_fall_back(tmp_path: Path) -> None:
    from harness.dist import run_distributed

    out = run_distributed(_one_rank_has_a_malformed_rng_state, 2, str(tmp_path / "root"))
    assert out == [(1, 1.0), (1, 1.0)]


def test_a_control_file_bigger_than_the_early_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptstore.engine import committed

    step_dir = two_steps(tmp_path / "root")
    monkeypatch.setattr(committed, "EARLY_READ_LIMIT", 16)  # every manifest is "too big"
    reader = ckptstore.reader(f"file://{step_dir}")  # opened, verified: no early copy used
    assert reader.manifest is not None and reader.manifest.step == 2


def test_an_object_item_claiming_terabytes_makes_restore_fall_back(tmp_path: Path) -> None:
    """A re-signed manifest and ``.metadata`` giving an object item (no tensor shape to
    check it by) a 10 TiB range in a 10 TiB file: the read cannot get a buffer for it, which
    is a ``CorruptCheckpointError`` that makes restore fall back (numpy's MemoryError
    escaped before)."""
    root = tmp_path / "root"
    step_dir = two_steps(root)
    md = _metadata(step_dir)
    index, info = _info_of(md, "n")
    big = 10 * 2**40
    md.storage_data[index] = type(info)(
        info.relative_path, info.offset, big, info.transform_descriptors
    )
    data = pickle.dumps(md)
    for p in step_dir.glob(".metadata*"):
        p.write_bytes(data)
    doc = json.loads((step_dir / MANIFEST_NAME).read_bytes())
    doc["files"][".metadata"] = {"size": len(data), "crc32c": format_crc(crc32c(data))}
    doc["files"][info.relative_path]["size"] = info.offset + big
    for r in doc["ranges"]:
        if r["key"] == "n@":
            r["length"] = big
    _resign(step_dir, doc)
    out = {"w": torch.zeros(64), "n": 0}
    with (
        CheckpointManager(str(root), background="thread") as mgr,
        pytest.warns(RuntimeWarning, match="no buffer"),
    ):
        assert mgr.restore(out) == 1
    assert out["n"] == 1 and torch.equal(out["w"], torch.full((64,), 1.0))
