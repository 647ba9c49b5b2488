"""The chaos run's bookkeeping on hand-made logs: effective trajectory, exactly-once,
restore checks, the goodput account and the example's worker-side plan (no processes)."""

from __future__ import annotations

import json

import pytest

from examples.resilience import eventlog
from examples.resilience.eventlog import RunLog, chaos_context, tensor_crc
from harness import chaos
from harness.chaos import ENV_PLAN, ChaosResult, Kill, KillRecord, SegmentRecord
from harness.goodput_report import account, plot_timeline
from harness.runlog import (
    check_exactly_once,
    check_restores,
    read_attempts,
    same_batches,
    trajectory,
)

N = 8  # samples; 2 ranks x 2 per rank = global batch 4: 2 steps per epoch
ORDER = [[5, 2, 7, 0, 3, 6, 1, 4], [1, 0, 6, 5, 7, 2, 4, 3], [3, 7, 0, 2, 6, 1, 5, 4]]


def ids_at(step: int, rank: int) -> list[int]:
    k0 = (step - 1) * 4
    epoch, pos = divmod(k0, N)
    return ORDER[epoch][pos + 2 * rank : pos + 2 * rank + 2]


def write_attempt(
    d: str,
    restart: int,
    steps: range,
    *,
    t: float,
    restored: int | None = None,
    saves: dict[int, str] | None = None,
    ready_crc: str = "",
    ids=ids_at,
) -> float:
    """Two ranks run ``steps``; 1 s per step, saves logged with their state checksums."""
    for rank in range(2):
        log = RunLog(d, 0, restart, rank)
        log.write("start", t=t, pid=1000 + restart * 10 + rank, world=2)
        crc = ready_crc or (saves or {}).get(restored or -1, "")
        cursor = 4 * restored if restored else 0
        log.write("ready", t=t + 2, restored=restored, cursor=cursor, state_crc=crc)
        now = t + 2
        for s in steps:
            log.write(
                "step", step=s, t0=now, t1=now + 1, k0=(s - 1) * 4, epoch=(s - 1) * 4 // N,
                ids=ids(s, rank), loss=1.0 / s, t=now + 1,
            )  # fmt: skip
            now += 1
            if saves and s in saves:
                log.write(
                    "save", step=s, t0=now, t1=now + 0.5, saved=True, cursor=4 * s,
                    state_crc=saves[s], t=now + 0.5,
                )  # fmt: skip
                log.write("commit", step=s, status="committed", t=now + 0.8)
                now += 0.5
        log.close()
    return now


def test_killed_and_resumed_run_is_exactly_once_and_restores_what_was_saved(tmp_path) -> None:
    d = str(tmp_path)
    end0 = write_attempt(d, 0, range(1, 5), t=0.0, saves={2: "aa"})  # killed after step 4
    write_attempt(d, 1, range(3, 7), t=end0 + 3, restored=2, saves={2: "aa", 4: "bb"})
    attempts = read_attempts(d)
    assert [a.id for a in attempts] == [(0, 0), (0, 1)]
    traj = trajectory(attempts)
    assert traj.steps == [1, 2, 3, 4, 5, 6]
    assert [r.step for r in traj.superseded] == [3, 4]
    assert traj.effective[3].attempt == (0, 1)
    check = check_exactly_once(traj, N, 6)
    assert check.ok, check.problems
    assert check.epochs == [(0, 8, 0, 0), (1, 8, 0, 0), (2, 8, 0, 0)]
    restores = check_restores(attempts)
    assert restores.ok, restores.problems
    assert restores.restores == [((0, 0), None), ((0, 1), 2)]
    assert same_batches(traj, traj, per_rank=True) == []


def test_a_repeated_sample_a_missing_step_and_a_wrong_restore_are_reported(tmp_path) -> None:
    d = str(tmp_path)

    def repeat(step: int, rank: int) -> list[int]:  # rank 1 re-reads rank 0's samples
        return ids_at(step, 0)

    end0 = write_attempt(d, 0, range(1, 3), t=0.0, saves={2: "aa"}, ids=repeat)
    write_attempt(d, 1, range(4, 5), t=end0 + 3, restored=2, ready_crc="zz")  # skips step 3
    attempts = read_attempts(d)
    check = check_exactly_once(trajectory(attempts), N, 4)
    assert not check.ok
    text = "\n".join(check.problems)
    assert "does not cover steps 1..4: [3]" in text
    assert "repeated" in text
    restores = check_restores(attempts)
    assert not restores.ok and "restored step 2 with state zz" in restores.problems[0]


def test_torn_log_line_is_skipped(tmp_path) -> None:
    d = str(tmp_path)
    write_attempt(d, 0, range(1, 3), t=0.0)
    with open(tmp_path / "s00-a00-r00.jsonl", "a") as f:
        f.write('{"ev":"step","step":3,"t0"')  # SIGKILL mid-write
    traj = trajectory(read_attempts(d))
    assert traj.steps == [1, 2]


def test_goodput_account_partitions_the_wall_clock(tmp_path) -> None:
    d = str(tmp_path)
    end0 = write_attempt(d, 0, range(1, 5), t=0.0, saves={2: "aa"})
    end1 = write_attempt(d, 1, range(3, 7), t=end0 + 3, restored=2, saves={2: "aa", 4: "bb"})
    result = ChaosResult(
        d,
        d,
        [SegmentRecord(2, launched=0.0, exited=end1 + 1, returncode=0)],
        [KillRecord(0, 0, "random", 1, pid=1001, t=end0 + 0.25, step=4)],
    )
    acct = account(result, read_attempts(d), interval_steps=2)
    s = acct.seconds
    assert s["train"] == pytest.approx(6.0)  # steps 1, 2 of attempt 0; 3..6 of attempt 1
    assert s["redone"] == pytest.approx(2.25)  # steps 3, 4 of attempt 0 + the cut 0.25 s
    assert s["blocking"] == pytest.approx(1.0)  # steps 2 (attempt 0) and 4 (attempt 1)
    assert s["startup"] == pytest.approx(2.0)
    assert s["restart"] == pytest.approx(end0 + 3 + 2 - (end0 + 0.25))
    assert sum(s.values()) == pytest.approx(acct.wall_s)
    assert len(acct.failures) == 1 and acct.failures[0].resumed_from == 2
    assert acct.failures[0].phase == "training, between steps"  # no save in flight
    assert acct.step_s == 1.0 and acct.tau_s == 2.0
    assert 0.0 <= acct.model_first_order <= acct.model_exponential <= 1.0
    assert "productive training (6 steps kept)" in acct.format()
    png = plot_timeline(acct, str(tmp_path / "t.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_example_reads_the_environment_the_harness_sets() -> None:
    for name in ("ENV_PLAN", "ENV_SEGMENT", "ENV_LOG"):
        assert getattr(eventlog, name) == getattr(chaos, name)


def test_chaos_context_arms_only_its_attempts_crash_point(monkeypatch) -> None:
    plan = {"1": {"at": "mid_upload:2", "rank": 1}}
    monkeypatch.setenv(ENV_PLAN, json.dumps(plan))
    monkeypatch.setenv("CKPTSTORE_CRASH_AT", "after_shards")  # inherited: replaced
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    # chaos_context sets it; set here first, monkeypatch removes it after the test (it
    # leaked into later tests' child processes, which then never reached their crash point)
    monkeypatch.setenv("CKPTSTORE_CRASH_RANK", "0")
    ctx = chaos_context("/tmp/x")
    assert ctx.crash == "" and "CKPTSTORE_CRASH_AT" not in __import__("os").environ
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    ctx = chaos_context("/tmp/x")
    env = __import__("os").environ
    assert (ctx.restart, ctx.crash) == (1, "mid_upload:2")
    assert (env["CKPTSTORE_CRASH_AT"], env["CKPTSTORE_CRASH_RANK"]) == ("mid_upload:2", "1")


def test_kill_spec_is_checked() -> None:
    Kill("after_marker:3")
    with pytest.raises(ValueError, match="mid_upload"):
        Kill("mid_uplaod")


def test_tensor_crc_depends_on_every_byte_and_key() -> None:
    import torch

    a = {"w": torch.arange(4.0), "b": torch.zeros(2)}
    assert tensor_crc(a) == tensor_crc({"b": torch.zeros(2), "w": torch.arange(4.0)})
    b = {"w": torch.arange(4.0), "b": torch.tensor([0.0, -0.0])}
    assert tensor_crc(a) != tensor_crc(b)


def test_a_node_whose_worker_comes_back_under_another_rank_has_two_groups() -> None:
    """A node that joins a running job may sort first and take rank 0: the first node's
    agent then restarts its worker as rank 1 under the same restart count. Its two lives
    are two groups (worlds 1 and 2), not one group of ranks 0 and 1."""
    from harness.nodelog import _worker_groups
    from harness.runlog import Attempt

    alone = [{"ev": "start", "t": 1.0, "world": 1}, {"ev": "step", "t": 2.0}]
    joined = [{"ev": "start", "t": 9.0, "world": 2}, {"ev": "step", "t": 10.0}]
    groups = _worker_groups([Attempt(0, 0, {0: alone, 1: joined})])
    assert groups == [{0: alone}, {1: joined}]
    two = [{"ev": "start", "t": 9.1, "world": 2}]  # two local workers of one round
    assert _worker_groups([Attempt(0, 0, {0: joined, 1: two})]) == [{0: joined, 1: two}]
