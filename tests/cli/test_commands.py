"""Every subcommand in-process (fast), on every backend: output, JSON and exit codes.

The same commands also run through the real console script in ``test_script.py``.
"""

from __future__ import annotations

import os
import tempfile
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckptstore.engine.commit import commit
from ckptstore.engine.committed import open_committed
from ckptstore.engine.manifest import MARKER_NAME
from ckptstore.engine.transfer import TransferEngine
from tests.cli.conftest import Backend, sample_state, save_ckpt, step, tear


def corrupt_largest_range(backend: Backend, url: str) -> tuple[str, int, int]:
    store = backend.open(url)
    r = max(open_committed(store).manifest.ranges, key=lambda r: r.length)
    data = bytearray(store.get(r.file))
    data[r.offset + r.length // 2] ^= 0xFF
    store.put(r.file, bytes(data))
    return r.file, r.offset, r.length


def stock_dcp(backend: Backend, url: str) -> None:
    """A checkpoint written by torch's own FileSystemWriter, uploaded through the store."""
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sample_state(), storage_writer=dcp.FileSystemWriter(tmp), no_dist=True)
        store = backend.open(url)
        for name in os.listdir(tmp):
            with open(os.path.join(tmp, name), "rb") as f:
                store.put(name, f.read())


# -- ls ----------------------------------------------------------------------------------
def test_ls_lists_status_size_and_uploads(backend, root_url, cli) -> None:
    for n in (100, 200, 300):
        save_ckpt(backend, step(root_url, n), sample_state(step=n))
    tear(backend, step(root_url, 200))
    upload = backend.open(root_url).begin_multipart("step_000000300/__0_0.a1.distcp")
    r = cli("ls", root_url)
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == ["STEP", "STATUS", "SIZE", "WORLD", "CREATED", "FORMAT"]
    assert "100  committed" in r.out and "200  incomplete" in r.out
    assert "v1 none" in r.out
    assert "1 unfinished multipart uploads" in r.out
    doc = cli("ls", root_url, "--json").json()
    assert [(c["step"], c["status"]) for c in doc["checkpoints"]] == [
        (100, "committed"),
        (200, "incomplete"),
        (300, "committed"),
    ]
    assert doc["checkpoints"][0]["world_size"] == 1 and doc["checkpoints"][0]["size"] > 0
    assert doc["uploads"]["unfinished"] == 1
    backend.open(root_url).abort_multipart(upload)


def test_ls_verify_finds_damage(backend, root_url, cli) -> None:
    save_ckpt(backend, step(root_url, 1))
    save_ckpt(backend, step(root_url, 2))
    assert cli("ls", root_url, "--verify").rc == 0
    corrupt_largest_range(backend, step(root_url, 1))
    assert cli("ls", root_url).rc == 0  # marker and manifest still agree
    r = cli("ls", root_url, "--verify")
    assert r.rc == 1 and "1  corrupt" in r.out and "checksum mismatch" in r.out


def test_ls_shows_checkpoints_under_other_names_in_their_own_section(backend, root_url, cli):
    save_ckpt(backend, step(root_url, 5))
    save_ckpt(backend, root_url + "/checkpoint_step5")
    save_ckpt(backend, root_url + "/step_000042")  # six digits: not a canonical step
    stock_dcp(backend, root_url + "/mymodel")
    backend.open(root_url).put("data/part-0.bin", b"not a checkpoint")
    r = cli("ls", root_url)
    assert r.rc == 0, r.err
    assert "other checkpoints under this root" in r.out
    rows = {tuple(line.split()) for line in r.out.splitlines()}
    assert {("checkpoint_step5", "committed"), ("step_000042", "committed")} <= rows
    assert ("mymodel", "stock") in rows and not any(row[:1] == ("data",) for row in rows)
    doc = cli("ls", root_url, "--json").json()
    assert doc["other_checkpoints"] == [
        {"name": "checkpoint_step5", "status": "committed"},
        {"name": "mymodel", "status": "stock"},
        {"name": "step_000042", "status": "committed"},
    ]
    assert [c["step"] for c in doc["checkpoints"]] == [5]


def test_ls_shows_which_tiers_hold_each_step(tool, tmp_path) -> None:
    from ckptstore import CheckpointManager, KeepAll

    root, tier, empty = (str(tmp_path / n) for n in ("root", "node0", "node1"))
    os.makedirs(empty)
    with CheckpointManager(root, local_tier_dir=tier, keep=KeepAll(), background="thread") as mgr:
        for n in (1, 2):
            mgr.save(n, {"w": torch.full((10,), float(n))})  # the local tier keeps step 2
    r = tool("ls", root, "--local-tier", tier, "--local-tier", empty)
    assert r.rc == 0, r.err
    rows = {line.split()[0]: line for line in r.out.splitlines()[1:3]}
    assert rows["2"].endswith("bucket, local 1: all, local 2: 0/1"), r.out
    assert rows["1"].endswith("bucket, local 1: 0/1, local 2: 0/1"), r.out
    assert f"local tier 1: {tier}" in r.out and f"local tier 2: {empty}" in r.out
    doc = tool("ls", root, "--local-tier", tier, "--json").json()
    assert doc["checkpoints"][1]["tiers"] == [{"dir": tier, "files": 1, "of": 1}]
    assert "tiers" not in tool("ls", root, "--json").json()["checkpoints"][0]
    missing = tool("ls", root, "--local-tier", str(tmp_path / "nope"))
    assert missing.rc == 2 and "--local-tier" in missing.err


def test_ls_counts_nothing_through_a_step_folder_that_is_a_link(tool, tmp_path) -> None:
    """A tier whose step folder is a symlink (to a whole copy elsewhere) holds nothing:
    the folder is resolved from the tier's descriptor, never followed."""
    from ckptstore import CheckpointManager

    root, tier, linked = (str(tmp_path / n) for n in ("root", "node0", "node1"))
    with CheckpointManager(root, local_tier_dir=tier, background="thread") as mgr:
        mgr.save(1, {"w": torch.ones(10)})
    os.makedirs(linked)
    os.symlink(os.path.join(tier, "step_000000001"), os.path.join(linked, "step_000000001"))
    doc = tool("ls", root, "--local-tier", tier, "--local-tier", linked, "--json").json()
    assert doc["checkpoints"][0]["tiers"] == [
        {"dir": tier, "files": 1, "of": 1},
        {"dir": linked, "files": 0, "of": 1},
    ]


def test_ls_lists_the_steps_saved_to_the_local_tier_alone(tool, tmp_path) -> None:
    from ckptstore import CheckpointManager

    root, tier = str(tmp_path / "root"), str(tmp_path / "node0")
    with CheckpointManager(
        root, local_tier_dir=tier, local_every=1, root_every=2, keep_local=2, background="thread"
    ) as mgr:
        for n in (2, 3):  # 2 to the bucket, 3 to the local tier alone
            mgr.save(n, {"w": torch.full((10,), float(n))})
            mgr.wait()
    r = tool("ls", root, "--local-tier", tier)
    assert r.rc == 0, r.err
    rows = {line.split()[0]: line for line in r.out.splitlines()[1:3]}
    assert rows["2"].endswith("bucket, local 1: all"), r.out
    assert rows["3"].endswith("not in the bucket, local 1: all"), r.out
    doc = tool("ls", root, "--local-tier", tier, "--json").json()
    assert [(c["step"], c["durable"]) for c in doc["checkpoints"]] == [(2, True), (3, False)]
    assert [c["step"] for c in tool("ls", root, "--json").json()["checkpoints"]] == [2]


def test_ls_missing_root_is_a_usage_error(backend, cli) -> None:
    r = cli("ls", backend.missing)
    assert r.rc == 2 and "Traceback" not in r.err
    assert f"nothing at {backend.missing}" in r.err
    if backend.name == "s3":  # a missing bucket says so, and where
        assert "bucket 'no-such-bucket-x' does not exist" in r.err


# -- inspect -----------------------------------------------------------------------------
def test_inspect_entries_chunks_files(backend, root_url, cli) -> None:
    url = save_ckpt(backend, step(root_url, 5), files_per_rank=2)
    r = cli("inspect", url)
    assert r.rc == 0, r.err
    assert "committed" in r.out and "step 5, world size 1, codec none" in r.out
    assert "model.w" in r.out and "float32" in r.out and "64x32" in r.out
    doc = cli("inspect", url, "--json").json()
    entries = {e["name"]: e for e in doc["entries"]}
    assert entries["model.w"]["bytes"] == 64 * 32 * 4 and entries["model.w"]["chunks"] == 1
    assert entries["model.b"]["dtype"] == "int64" and entries["model.b"]["shape"] == [10]
    assert entries["step"]["kind"] == "object" and entries["meta.name"]["stored_bytes"] > 0
    assert doc["totals"]["tensors"] == 2 and doc["totals"]["objects"] == 2
    assert len({f for e in doc["entries"] for f in e["files"]}) == 2
    assert doc["manifest"]["format_version"] == 1 and doc["status"] == "committed"


def test_inspect_stock_and_incomplete(backend, root_url, cli) -> None:
    stock_dcp(backend, root_url + "/stock")
    r = cli("inspect", root_url + "/stock")
    assert r.rc == 0 and "stock DCP checkpoint" in r.out and "model.w" in r.out
    url = save_ckpt(backend, step(root_url, 9))
    tear(backend, url)
    r = cli("inspect", url)
    assert r.rc == 0 and "INCOMPLETE" in r.out and "model.w" in r.out
    assert cli("inspect", url, "--json").json()["status"] == "incomplete"


def test_inspect_bad_locations(backend, root_url, cli) -> None:
    backend.open(root_url + "/notes").put("readme.txt", b"hello")
    r = cli("inspect", root_url + "/notes")
    assert r.rc == 2 and "is not a checkpoint" in r.err
    r = cli("inspect", backend.missing)
    assert r.rc == 2 and "nothing at" in r.err


# -- verify ------------------------------------------------------------------------------
def test_verify_ok_then_corrupt_shard(backend, root_url, cli) -> None:
    url = save_ckpt(backend, step(root_url, 1), files_per_rank=2)
    r = cli("verify", url)
    assert r.rc == 0 and r.out.rstrip().splitlines()[-1].startswith("OK:")
    name, offset, length = corrupt_largest_range(backend, url)
    r = cli("verify", url)
    assert r.rc == 1
    assert f"BAD  {name}" in r.out and f"bytes [{offset}, {offset + length})" in r.out
    doc = cli("verify", url, "--json").json()
    [bad] = [f for f in doc["files"] if not f["ok"]]
    assert bad["bad_ranges"][0]["offset"] == offset and doc["ok"] is False


def test_verify_incomplete_stock_and_missing(backend, root_url, cli) -> None:
    url = save_ckpt(backend, step(root_url, 1))
    tear(backend, url)
    r = cli("verify", url)
    assert r.rc == 1 and "no COMMITTED marker" in r.out
    stock_dcp(backend, root_url + "/stock")
    r = cli("verify", root_url + "/stock")
    assert r.rc == 0 and "without checksums" in r.out
    assert cli("verify", backend.missing).rc == 2


# -- convert -----------------------------------------------------------------------------
def test_convert_round_trips_every_format(backend, root_url, cli, tmp_path) -> None:
    src = save_ckpt(backend, step(root_url, 3))
    pt, st = str(tmp_path / "m.pt"), root_url + "/m.safetensors"
    z, back = root_url + "/z", root_url + "/back"
    assert cli("convert", src, z, "--to", "dcp", "--compress", "zstd").rc == 0
    assert cli("inspect", z, "--json").json()["manifest"]["codec"] == "zstd"
    assert cli("convert", z, pt, "--to", "torch").rc == 0
    loaded = torch.load(pt, weights_only=True)
    assert torch.equal(loaded["model"]["w"], sample_state()["model"]["w"])
    assert loaded["step"] == 7 and loaded["meta"] == {"name": "run"}
    r = cli("convert", pt, st, "--to", "safetensors")
    assert r.rc == 2 and "--drop-objects" in r.err
    assert cli("convert", pt, st, "--to", "safetensors", "--drop-objects").rc == 0
    assert cli("convert", st, back, "--to", "dcp").rc == 0
    assert cli("diff", src, z).rc == 0
    assert cli("diff", src, pt).rc == 0
    d = cli("diff", src, back, "--json").json()
    assert d["counts"] == {"equal": 2, "missing": 2}  # safetensors dropped the two objects


def test_convert_refusals(backend, root_url, cli) -> None:
    src = save_ckpt(backend, step(root_url, 3))
    dst = root_url + "/out"
    assert cli("convert", src, dst, "--to", "dcp").rc == 0
    r = cli("convert", src, dst, "--to", "dcp")
    assert r.rc == 2 and "--force" in r.err
    assert cli("convert", src, dst, "--to", "dcp", "--compress", "zstd", "--force").rc == 0
    assert cli("inspect", dst, "--json").json()["manifest"]["codec"] == "zstd"
    assert cli("verify", dst).rc == 0
    r = cli("convert", src, root_url + "/x.pt", "--to", "torch", "--compress", "zstd")
    assert r.rc == 2 and "--compress" in r.err
    tear(backend, src)
    r = cli("convert", src, root_url + "/y", "--to", "dcp")
    assert r.rc == 2 and "incomplete" in r.err
    r = cli("convert", backend.missing, root_url + "/y", "--to", "dcp")
    assert r.rc == 2 and "nothing at" in r.err


def test_convert_adopts_stock_dcp(backend, root_url, cli) -> None:
    stock_dcp(backend, root_url + "/stock")
    assert cli("convert", root_url + "/stock", root_url + "/adopted", "--to", "dcp").rc == 0
    assert cli("verify", root_url + "/adopted").rc == 0
    r = cli("diff", root_url + "/stock", root_url + "/adopted")
    assert r.rc == 0
    assert r.err.count("is a stock DCP checkpoint") == 1  # one note, not one per read


# -- cp ----------------------------------------------------------------------------------
def test_cp_copies_verifies_and_commits(backend, root_url, cli) -> None:
    src = save_ckpt(backend, step(root_url, 4), files_per_rank=3)
    dst = root_url + "/copy/step_000000004"
    r = cli("cp", src, dst, "--part-size-mib", "0.004")
    assert r.rc == 0 and "committed" in r.out, r.err
    assert cli("verify", dst).rc == 0 and cli("diff", src, dst).rc == 0
    r = cli("cp", src, dst)
    assert r.rc == 2 and "not empty" in r.err
    assert cli("cp", src, dst, "--force", "--json").json()["committed"] is True


def test_cp_refuses_torn_corrupt_and_foreign(backend, root_url, cli) -> None:
    src = save_ckpt(backend, step(root_url, 4))
    corrupt_largest_range(backend, src)
    dst = root_url + "/copy"
    r = cli("cp", src, dst)
    assert r.rc == 1 and "crc32c" in r.err
    assert backend.open(dst).find() == []
    tear(backend, src)
    r = cli("cp", src, dst)
    assert r.rc == 2 and "incomplete" in r.err
    backend.open(root_url + "/notes").put("a.txt", b"x")
    assert cli("cp", root_url + "/notes", dst).rc == 2
    assert cli("cp", backend.missing, dst).rc == 2


# -- gc ----------------------------------------------------------------------------------
def test_gc_retention_torn_and_uploads(backend, root_url, cli) -> None:
    for n in (1000, 1300, 1600, 1900, 2200, 2500):
        save_ckpt(backend, step(root_url, n))
    tear(backend, step(root_url, 1600))
    save_ckpt(backend, step(root_url, 2800))
    tear(backend, step(root_url, 2800))  # newer than the newest commit: maybe in flight
    root = backend.open(root_url)
    root.begin_multipart("step_000002800/__0_0.b2.distcp")
    r = cli("gc", root_url, "--keep-last", "2", "--keep-every", "1000", "--dry-run")
    assert r.rc == 0 and "would delete" in r.out
    assert len([n for n in root.listdir() if n.startswith("step_")]) == 7  # dry run
    doc = cli("gc", root_url, "--keep-last", "2", "--keep-every", "1000", "--json").json()
    assert doc["deleted_steps"] == [1300, 1600, 1900]
    left = cli("ls", root_url, "--json").json()["checkpoints"]
    assert [(c["step"], c["status"]) for c in left] == [
        (1000, "committed"),
        (2200, "committed"),
        (2500, "committed"),
        (2800, "incomplete"),
    ]
    assert len(root.list_multipart()) == 1  # young upload kept
    r = cli("gc", root_url, "--keep-last", "1", "--protect", "1000", "--stale-after-hours", "0")
    assert r.rc == 0 and "aborted 1 uploads" in r.out
    left = [c["step"] for c in cli("ls", root_url, "--json").json()["checkpoints"]]
    assert left == [1000, 2500, 2800] and root.list_multipart() == []


def test_gc_never_deletes_the_newest_and_needs_a_policy(backend, root_url, cli) -> None:
    save_ckpt(backend, step(root_url, 1))
    r = cli("gc", root_url, "--keep-every", "1000000")
    assert r.rc == 0 and cli("ls", root_url, "--json").json()["checkpoints"][0]["step"] == 1
    r = cli("gc", root_url)
    assert r.rc == 2 and "--keep-last" in r.err
    assert cli("gc", root_url, "--keep-last", "0").rc == 2
    assert cli("gc", backend.missing, "--keep-last", "1").rc == 2


# -- diff --------------------------------------------------------------------------------
def test_diff_reports_max_abs_difference(backend, root_url, cli) -> None:
    a = save_ckpt(backend, step(root_url, 1))
    state = sample_state()
    state["model"]["w"][3, 4] += 0.5
    state["extra"] = torch.zeros(2)
    b = save_ckpt(backend, step(root_url, 2), state)
    r = cli("diff", a, b)
    assert r.rc == 1
    assert "model.w  differs" in r.out and "0.5" in r.out and "missing in A" in r.out
    doc = cli("diff", a, b, "--json", "--batch-mib", "0.001").json()
    rows = {e["name"]: e for e in doc["entries"]}
    assert rows["model.w"]["max_abs_diff"] == pytest.approx(0.5)
    assert rows["model.b"]["status"] == "equal" and doc["same"] is False
    assert cli("diff", a, a).rc == 0


def test_diff_atol_and_dtype(backend, root_url, cli) -> None:
    a = save_ckpt(backend, step(root_url, 1))
    state = sample_state()
    state["model"]["w"] += 1e-4
    b = save_ckpt(backend, step(root_url, 2), state)
    assert cli("diff", a, b).rc == 1
    assert cli("diff", a, b, "--atol", "1e-3").rc == 0
    state = sample_state()
    state["model"]["w"] = state["model"]["w"].half()
    c = save_ckpt(backend, step(root_url, 3), state)
    r = cli("diff", a, c)
    assert r.rc == 1 and "dtype float32 vs float16" in r.out


# -- goodput -----------------------------------------------------------------------------
def _value(out: str, label: str) -> float:
    line = next(x for x in out.splitlines() if x.startswith(label))
    return float(line.split()[-2].replace(",", ""))


def test_goodput_reproduces_the_mission_figures(tool) -> None:
    r = tool("goodput", "--failures-per-day", "8.6", "--interval-min", "120")
    assert r.rc == 0 and round(_value(r.out, "Goodput (first-order model)")) == 64
    r = tool("goodput", "--failures-per-day", "8.6", "--interval-min", "30")
    assert round(_value(r.out, "Goodput (first-order model)")) == 91
    for gpus, pct in ((256, 19), (1024, 57)):
        r = tool("goodput", "--gpus", str(gpus), "--afr", "1%", "--days", "30")
        assert round(_value(r.out, "P(at least one failure")) == pct
    doc = tool("goodput", "--gpus", "256", "--afr", "0.01", "--json").json()
    assert doc["report"]["failure_probability"] == pytest.approx(0.19, abs=0.005)


def test_goodput_prints_the_gain_of_a_peer_tier(tool) -> None:
    """The MISSION example with a peer tier every 30 min beside the bucket's 2 h."""
    args = ("goodput", "--failures-per-day", "8.6", "--interval-min", "120")
    r = tool(*args, "--peer-interval-min", "30", "--peer-share", "90%")
    assert r.rc == 0 and round(_value(r.out, "Goodput (first-order model)")) == 64
    assert _value(r.out, "Goodput with the peer tier") == pytest.approx(88.4, abs=0.05)
    assert _value(r.out, "Gain of the peer tier") == pytest.approx(24.2, abs=0.05)
    every = tool(*args, "--peer-interval-min", "30", "--peer-share", "1")
    assert round(_value(every.out, "Goodput with the peer tier")) == 91  # = 30 min alone
    assert "peer tier" not in tool(*args).out
    bad = tool(*args, "--peer-interval-min", "30", "--peer-share", "1.5")
    assert bad.rc == 2 and "--peer-share" in bad.err
    assert tool(*args, "--peer-interval-min", "0").rc == 2
    plan = tool("goodput", "--plan", "--peer-interval-min", "30")
    assert plan.rc == 2 and "--plan does not use --peer-interval-min" in plan.err


def test_goodput_prices_and_bad_input(tool) -> None:
    r = tool(
        "goodput",
        *("--gpus", "1024", "--afr", "0.01", "--interval-min", "30", "--blocking-s", "10"),
        *("--gpu-hour", "2.5", "--checkpoint-gb", "500", "--storage-gb-month", "0.02"),
    )
    assert r.rc == 0 and "Total (priced items)" in r.out and "$" in r.out
    assert tool("goodput", "--interval-min", "30").rc == 2  # no failure rate
    assert tool("goodput", "--gpus", "8", "--afr", "5", "--days", "3").rc == 2  # 500 %/year
    assert tool("goodput", "--failures-per-day", "1", "--afr", "0.01").rc == 2  # both
    assert tool("goodput", "--failures-per-day", "x").rc == 2


def with_timings(backend: Backend, url: str, blocking_s: float) -> None:
    """Re-commit ``url`` with the timings the checkpoint manager records in its manifest."""
    store = backend.open(url)
    committed = open_committed(store)
    committed.manifest.extra["timings"] = {"blocking_s": blocking_s, "upload_s": 9.0}
    store.delete(MARKER_NAME)
    with TransferEngine() as engine:
        commit(store, engine, "retimed", committed.manifest, committed.metadata_bytes)


def test_goodput_from_measured_timings(backend, root_url, cli) -> None:
    save_ckpt(backend, step(root_url, 1))
    r = cli("goodput", "--failures-per-day", "8.6", "--from", root_url)
    assert r.rc == 2 and "timings" in r.err
    for n, blocking in ((2, 1.0), (3, 3.0), (4, 2.0)):
        with_timings(backend, save_ckpt(backend, step(root_url, n)), blocking)
    doc = cli("goodput", "--failures-per-day", "8.6", "--from", root_url, "--json").json()
    assert doc["measured"]["blocking_s"] == 2.0 and doc["measured"]["checkpoints"] == 3
    assert doc["report"]["inputs"]["blocking_s"] == 2.0
    assert doc["report"]["inputs"]["checkpoint_gb"] > 0
    args = ("--failures-per-day", "8.6", "--from", root_url, "--blocking-s", "5", "--json")
    assert cli("goodput", *args).json()["report"]["inputs"]["blocking_s"] == 5.0  # flag wins
