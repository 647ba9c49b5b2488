"""``ckptstore-tool goodput --plan``: the scale projection over a real root and its flags."""

from __future__ import annotations

import json

import pytest
import torch

import ckptstore
from ckptstore import CheckpointManager
from ckptstore.planning.scale import LAYOUTS, Limit

RATES = ("--rank-write-gb-s", "1", "--rank-read-gb-s", "2")


def _root(tmp_path) -> tuple[str, int]:
    """A root of three real checkpoints: step 1 by ckptstore.save (flat, no timings), steps
    2-3 by the manager (spread, with timings); returns it and one rank's shard bytes."""
    root = tmp_path / "run"
    state = {"w": torch.arange(250_000, dtype=torch.float32), "b": torch.ones(10)}
    ckptstore.save(state, str(root / "step_000000001"))
    with CheckpointManager(str(root), async_save=False, key_layout="spread") as mgr:
        for step in (2, 3):
            assert mgr.save(step, state)
    doc = json.loads((root / "step_000000001" / "ckptstore.manifest.json").read_text())
    shard = sum(e["size"] for name, e in doc["files"].items() if name.endswith(".distcp"))
    return str(root), shard


def test_plan_from_a_real_root(tool, tmp_path) -> None:
    root, shard = _root(tmp_path)
    doc = tool("goodput", "--plan", "--from", root, *RATES, "--sweep", "1k,100k", "--json")
    assert doc.rc == 0, doc.err
    out = doc.json()
    m = out["measured"]
    assert m["checkpoints"] == 3 and m["world_size"] == 1 and m["files_per_rank"] == 1
    assert m["timed_checkpoints"] == 2 and m["blocking_s"] > 0  # the manager's own timings
    assert m["rank_gb"] == pytest.approx(shard / 1e9, rel=0.01)  # 1 MB of tensors, ~1 part
    assert out["figures"]["bytes_per_rank"] == pytest.approx(m["rank_gb"] * 1e9)
    assert out["figures"]["blocking_s"] == m["blocking_s"]
    # Schema: one point per (GPU count, layout), each with a save and a restore phase.
    points = out["points"]
    assert [(p["gpus"], p["layout"]) for p in points] == [
        (n, lay) for n in (1_000, 100_000) for lay in LAYOUTS
    ]
    limits = {x.value for x in Limit}
    for p in points:
        assert set(p) >= {"gpus", "nodes", "layout", "checkpoint_gb", "blocking_s", "cost"}
        for phase in (p["save"], p["restore_root"]):
            assert phase["binding"] in limits and set(phase["limit_s"]) == limits
            assert phase["seconds"] == max(phase["limit_s"].values())
            assert phase["hottest_prefix"] in ("step", "shard")
        assert p["restore_local_s"] is None  # no --local-gb-s
    assert p["checkpoint_gb"] == pytest.approx(100_000 * m["rank_gb"])
    assert set(out["store_bound_from_gpus"]) == {
        f"{ph}_{lay}" for ph in ("save", "restore") for lay in LAYOUTS
    }
    assert set(out["store_bound_by"]) == set(out["store_bound_from_gpus"])
    for key, by in out["store_bound_by"].items():  # named where a limit binds, else None
        assert (by is None) == (out["store_bound_from_gpus"][key] is None)
        assert by is None or by in limits
    # Flags win over what --from measured.
    args = ("goodput", "--plan", "--from", root, *RATES, "--rank-gb", "3", "--blocking-s", "7")
    again = tool(*args, "--files-per-rank", "2", "--json").json()
    assert again["figures"]["bytes_per_rank"] == 3e9 and again["figures"]["blocking_s"] == 7
    assert again["figures"]["files_per_rank"] == 2


def test_plan_table(tool) -> None:
    r = tool(
        "goodput",
        "--plan",
        "--rank-gb",
        "2",
        *RATES,
        "--blocking-s",
        "1.5",
        "--local-gb-s",
        "10",
        "--put-per-1k",
        "0.005",
        "--storage-gb-month",
        "0.023",
    )
    assert r.rc == 0, r.err
    for n in ("1,000 GPUs (125 nodes)", "10,000 GPUs", "100,000 GPUs (12,500 nodes)"):
        assert n in r.out
    assert r.out.count("FLAT") == 3 and "prefix_request_rate" in r.out
    assert "Restore from the local tier" in r.out and "Request cost per save" in r.out
    assert "GPU time blocked" not in r.out  # no --gpu-hour: not priced
    assert (
        "Store-side limits bind the save (flat: prefix_request_rate from 113 GPUs; spread: "
        "prefix_request_rate from 28,673 GPUs)" in r.out
    )
    assert (  # rank 0 reads the small objects once: the shards' GETs bind restores first
        "Store-side limits bind the restore (flat: prefix_request_rate from 92 GPUs; spread: "
        "prefix_request_rate from 23,297 GPUs)" in r.out
    )


def test_plan_errors_name_the_flags(tool, tmp_path) -> None:
    r = tool("goodput", "--plan", "--rank-gb", "2")
    assert r.rc == 2 and "--rank-write-gb-s" in r.err and "--rank-read-gb-s" in r.err
    r = tool("goodput", "--plan", *RATES)
    assert r.rc == 2 and "--rank-gb (or --from ROOT)" in r.err
    r = tool("goodput", "--plan", "--rank-gb", "2", *RATES, "--failures-per-day", "3")
    assert r.rc == 2 and "--plan does not use --failures-per-day" in r.err
    r = tool("goodput", "--plan", "--rank-gb", "2", *RATES, "--nic-gb-s", "-1")
    assert r.rc == 2 and "--nic-gb-s must be a finite number > 0" in r.err
    r = tool("goodput", "--plan", "--rank-gb", "0", *RATES)
    assert r.rc == 2 and "--rank-gb must be" in r.err
    r = tool("goodput", "--plan", "--rank-gb", "2", *RATES, "--part-mb", "0")
    assert r.rc == 2 and "--part-mb must be > 0" in r.err
    assert tool("goodput", "--plan", "--sweep", "1k,none").rc == 2
    (tmp_path / "empty").mkdir()
    r = tool("goodput", "--plan", *RATES, "--from", str(tmp_path / "empty"))
    assert r.rc == 2 and str(tmp_path / "empty") in r.err and "Traceback" not in r.err
