"""Measured goodput of a chaos run, the analytic model's for the same inputs, and a timeline.

    acct = account(result, read_attempts(result.log_dir), interval_steps=4)
    print(acct.format())                    # where the wall-clock time went, measured vs model
    plot_timeline(acct, "timeline.png")     # steps, saves, uploads, failures, restarts

Rank 0's events split the wall clock (first torchrun launch to last exit) into disjoint
phases: ``startup`` (launch to the first step), ``train`` (steps of the effective run),
``redone`` (steps that a later restart ran again, plus the step cut by a kill), ``blocking``
(``CheckpointManager.save`` until training may go on), ``restart`` (from a failure until
the next attempt trains: detection, process start, restore), ``resize`` (a stopped job's
final checkpoint, exit, relaunch on another process count, restore) and ``shutdown`` (the
last step to the exit: the final upload, writing results). ``other`` is what remains
(logging, the loss all-reduce's wait, epoch changes). Uploads run in the background and
overlap training; they are drawn but not counted.

The model (:mod:`ckptstore.planning.goodput`) gets the *measured* inputs: failure rate = failures /
``run_s`` (the wall clock minus startup, resize and shutdown, where failures could strike),
interval ``tau`` = ``interval_steps`` times the median effective step, blocking ``C`` = the mean
blocking of a save, restart ``R`` = the mean restart. Measured goodput over the same window is
``train / run_s``. The first-order model charges each failure half an interval of re-done work;
kills at named crash points strike during a save, so their re-done work is a whole interval
or more, and the measured figure may sit below the model with few failures.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ckptstore.planning.goodput import GoodputInputs, expected_goodput
from harness.chaos import ChaosResult, KillRecord
from harness.runlog import Attempt, trajectory

__all__ = ["Phase", "Failure", "GoodputAccount", "account", "plot_timeline", "timeline_kinds"]

COUNTED = ("startup", "train", "redone", "blocking", "restart", "resize", "shutdown")

_POINTS = {
    "after_shards": "a save: its shard written to the node-local tier, not yet uploaded",
    "mid_upload": "a save's background upload (first part sent)",
    "before_marker": "a save's commit: manifest and .metadata written, COMMITTED not yet",
    "after_marker": "a save's commit: COMMITTED written, canonical copies not yet",
}


@dataclass(frozen=True)
class Phase:
    kind: str  # one of COUNTED, or "upload" (background, not counted)
    t0: float
    t1: float
    label: str = ""

    @property
    def seconds(self) -> float:
        return max(0.0, self.t1 - self.t0)


@dataclass(frozen=True)
class Failure:
    t: float
    attempt: tuple[int, int]
    how: str  # "SIGKILL rank 1 at a random time" / "crash point mid_upload:1 on rank 1"
    phase: str  # what the job was doing
    last_step: int  # the last step rank 0 finished before it
    resumed_from: int | None  # the step the next attempt restored
    restart_s: float


@dataclass
class GoodputAccount:
    wall_s: float
    seconds: dict[str, float]  # per COUNTED kind, plus "other"
    steps: int
    redone_steps: int
    saves: int
    failures: list[Failure]
    interval_steps: int
    step_s: float  # median effective step
    blocking_per_save_s: float
    restart_per_failure_s: float
    run_s: float
    measured: float  # train / run_s
    end_to_end: float  # train / wall_s
    model_first_order: float
    model_exponential: float
    phases: list[Phase] = field(default_factory=list)
    t0: float = 0.0
    resizes: list[tuple[float, str]] = field(default_factory=list)
    commits: list[tuple[float, int]] = field(default_factory=list)
    step_points: list[tuple[float, int, bool]] = field(default_factory=list)  # (t1, step, kept)

    @property
    def tau_s(self) -> float:
        return self.interval_steps * self.step_s

    @property
    def failure_rate_per_h(self) -> float:
        return 3600.0 * len(self.failures) / self.run_s if self.run_s > 0 else 0.0

    @property
    def model_per_interval(self) -> float:
        """The first-order terms charged per interval of *productive* training.

        Per ``tau`` of kept work the job also pays ``C`` and, at ``rate`` failures per wall
        second, ``rate * W * (tau/2 + R)`` for a wall time ``W`` per interval; solving
        ``W = tau + C + rate * W * (tau/2 + R)`` gives ``tau / W`` below. To first order it
        is ckptstore.planning.goodput's ``1 - C/tau - rate*(tau/2 + R)``, which charges ``C`` per
        ``tau`` of *wall* time and so falls apart when losses are large.
        """
        lam = len(self.failures) / self.run_s if self.run_s > 0 else 0.0
        tau, c, r = self.tau_s, self.blocking_per_save_s, self.restart_per_failure_s
        if tau <= 0:
            return 0.0
        return max(0.0, 1.0 - lam * (tau / 2 + r)) * tau / (tau + c)

    def format(self) -> str:
        """Where the wall clock went, then goodput measured against the models."""
        sec, wall, run = self.seconds, self.wall_s, self.run_s
        n = len(self.failures)
        names = {
            "startup": "startup (launch, imports, first restore)",
            "train": f"productive training ({self.steps} steps kept)",
            "redone": f"re-done steps ({self.redone_steps} steps, work lost to failures)",
            "blocking": f"checkpoint blocking ({self.saves} save() calls)",
            "restart": f"restarts ({n}: detect, relaunch, restore)",
            "resize": f"resizes ({len(self.resizes)}: final save, relaunch, restore)",
            "shutdown": "shutdown (last upload, exit)",
            "other": "other (logging, loss all-reduce waits)",
        }
        lines = [f"| where the {wall:.1f} s went | seconds | % |", "| --- | ---: | ---: |"]
        for kind in (*COUNTED, "other"):
            if sec[kind] or kind in ("train", "blocking"):
                lines.append(f"| {names[kind]} | {sec[kind]:.2f} | {100 * sec[kind] / wall:.1f} |")
        lam = n / run if run > 0 else 0.0
        mtbf = f"MTBF {run / n:.1f} s" if n else "no failures"
        redone = sec["redone"] / n if n else 0.0
        lines += [
            "",
            f"model inputs, measured over the {run:.1f} s run window (wall clock minus startup, "
            f"resizes and shutdown): {n} failures ({3600 * lam:.0f}/h, {mtbf}); interval "
            f"tau = {self.interval_steps} steps x {1000 * self.step_s:.0f} ms = {self.tau_s:.2f} s;"
            f" blocking C = {1000 * self.blocking_per_save_s:.1f} ms/save; restart R = "
            f"{self.restart_per_failure_s:.2f} s/failure",
            f"re-done work per failure: measured {redone:.2f} s "
            f"({self.redone_steps / max(1, n):.1f} steps); the model assumes tau/2 = "
            f"{self.tau_s / 2:.2f} s ({self.interval_steps / 2:g} steps)",
            "| goodput over the run window | % |",
            "| --- | ---: |",
            f"| measured: productive / run window | {100 * self.measured:.1f} |",
            f"| model, first-order `1 - C/tau - rate*(tau/2 + R)` (ckptstore.planning.goodput) | "
            f"{100 * self.model_first_order:.1f} |",
            "| model, exponential (Daly; ckptstore.planning.goodput) | "
            f"{100 * self.model_exponential:.1f} |",
            f"| model, same terms per productive interval `(1 - rate*(tau/2 + R)) * tau/(tau + C)` "
            f"| {100 * self.model_per_interval:.1f} |",
        ]
        if lam * self.restart_per_failure_s > 0.1 or (
            self.tau_s > 0 and self.blocking_per_save_s / self.tau_s > 0.1
        ):
            lines.append(
                f"(rate x R = {lam * self.restart_per_failure_s:.2f}, C / tau = "
                f"{self.blocking_per_save_s / self.tau_s if self.tau_s else 0:.2f}: outside the "
                "small-loss range the first-order model is derived for, C << tau << MTBF and "
                "R << MTBF)"
            )
        return "\n".join(lines)


def _failure_time(a: Attempt, kill: KillRecord | None) -> float:
    if kill is not None and kill.t is not None:
        return kill.t
    return a.last_time()


def _phase_at(a: Attempt, t: float) -> str:
    """What rank 0 of ``a`` was doing at time ``t``."""
    for e in a.events("step"):
        if e["t0"] <= t <= e["t1"]:
            return f"training step {e['step']}"
    saves = a.events("save")
    for e in saves:
        if e["t0"] <= t <= e["t1"]:
            return f"the save of step {e['step']}: its staging copy (blocking)"
    done = {e["step"]: e["t"] for e in a.events("commit")}
    for e in reversed(saves):
        if e["t1"] <= t and (e["step"] not in done or done[e["step"]] >= t) and e["saved"]:
            return f"training, while step {e['step']}'s save uploads in the background"
    return "training, between steps"


def account(result: ChaosResult, attempts: list[Attempt], interval_steps: int) -> GoodputAccount:
    """Split ``result``'s wall clock into phases and compare with the model (module doc)."""
    traj = trajectory(attempts)
    kept = {(run.attempt, run.step) for run in traj.effective.values()}
    t_begin = result.segments[0].launched
    t_end = result.segments[-1].exited
    phases: list[Phase] = []
    kills = {(k.segment, k.restart): k for k in result.kills}
    failures: list[Failure] = []
    resizes: list[tuple[float, str]] = []
    commits: list[tuple[float, int]] = []
    points: list[tuple[float, int, bool]] = []
    blocking: list[float] = []
    saves = 0
    prev_end: tuple[float, str, Any] | None = None  # (time, "failure"/"stop", Failure)
    for i, a in enumerate(attempts):
        steps = a.events("step")
        first_t0 = steps[0]["t0"] if steps else a.last_time()
        if prev_end is None:
            phases.append(Phase("startup", t_begin, first_t0))
        else:
            t, kind, failure = prev_end
            phases.append(Phase(kind, t, first_t0))
            if failure is not None:
                ready = a.first("ready")
                failures.append(
                    Failure(
                        failure.t,
                        failure.attempt,
                        failure.how,
                        failure.phase,
                        failure.last_step,
                        ready["restored"] if ready else None,
                        first_t0 - t,
                    )
                )
        for e in steps:
            keep = (a.id, e["step"]) in kept
            phases.append(Phase("train" if keep else "redone", e["t0"], e["t1"], str(e["step"])))
            points.append((e["t1"], e["step"], keep))
        commit_t = {e["step"]: e["t"] for e in a.events("commit") if e["status"] == "committed"}
        commits += [(t, s) for s, t in commit_t.items()]
        for e in a.events("save"):
            if e.get("final"):
                continue
            saves += 1
            blocking.append(e["t1"] - e["t0"])
            phases.append(Phase("blocking", e["t0"], e["t1"], str(e["step"])))
            if e["saved"]:
                end = commit_t.get(e["step"], e["t1"])
                phases.append(Phase("upload", e["t1"], end, str(e["step"])))
        last_work = max(
            [e["t1"] for e in steps] + [e["t1"] for e in a.events("save") if not e.get("final")],
            default=first_t0,
        )
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        if nxt is None:
            phases.append(Phase("shutdown", last_work, t_end))
        elif nxt.segment != a.segment:
            seg = result.segments[nxt.segment]
            resizes.append((last_work, f"{a.world} -> {seg.nproc} procs"))
            prev_end = (last_work, "resize", None)
        else:
            kill = kills.get(a.id)
            t_fail = max(_failure_time(a, kill), last_work)
            phases.append(Phase("redone", last_work, t_fail, "cut by the failure"))
            if kill is None:
                how, what = "unplanned failure", "unknown"
            elif kill.at == "random":
                how = f"SIGKILL of rank {kill.rank} (pid {kill.pid}) at a random time"
                what = _phase_at(a, t_fail)
            else:
                how = f"crash point {kill.at} on rank {kill.rank}"
                what = _POINTS.get(kill.at.partition(":")[0], kill.at)
            last_step = steps[-1]["step"] if steps else -1
            prev_end = (t_fail, "restart", Failure(t_fail, a.id, how, what, last_step, None, 0.0))
    counted = [p for p in phases if p.kind in COUNTED]
    seconds = {k: sum(p.seconds for p in counted if p.kind == k) for k in COUNTED}
    wall = t_end - t_begin
    seconds["other"] = max(0.0, wall - sum(seconds.values()))
    run_s = wall - seconds["startup"] - seconds["resize"] - seconds["shutdown"]
    kept_steps = [r.t1 - r.t0 for r in traj.effective.values()]
    step_s = statistics.median(kept_steps) if kept_steps else 0.0  # robust to warm-up steps
    c = statistics.fmean(blocking) if blocking else 0.0
    r = statistics.fmean(f.restart_s for f in failures) if failures else 0.0
    tau = interval_steps * step_s
    models = (0.0, 0.0)
    if run_s > 0 and tau > 0:
        inputs = GoodputInputs(
            interval_min=tau / 60.0,
            days=run_s / 86400.0,
            failures_per_day=len(failures) * 86400.0 / run_s,
            blocking_s=c,
            restart_min=r / 60.0,
        )
        models = (expected_goodput(inputs), expected_goodput(inputs, "exponential"))
    return GoodputAccount(
        wall_s=wall,
        seconds=seconds,
        steps=len(traj.effective),
        redone_steps=len(traj.superseded),
        saves=saves,
        failures=failures,
        interval_steps=interval_steps,
        step_s=step_s,
        blocking_per_save_s=c,
        restart_per_failure_s=r,
        run_s=run_s,
        measured=seconds["train"] / run_s if run_s > 0 else 0.0,
        end_to_end=seconds["train"] / wall if wall > 0 else 0.0,
        model_first_order=models[0],
        model_exponential=models[1],
        phases=phases,
        t0=t_begin,
        resizes=resizes,
        commits=sorted(commits),
        step_points=points,
    )


_COLORS = {
    "train": "#2ca02c",
    "redone": "#ff7f0e",
    "blocking": "#1f77b4",
    "upload": "#9ecae1",
    "restart": "#7f7f7f",
    "resize": "#9467bd",
    "startup": "#c5b0d5",
    "shutdown": "#8c564b",
}


def timeline_kinds(acct: GoodputAccount) -> list[str]:
    """The kinds of time the run had (a phase of them lasted > 0 s), in legend order."""
    had = {p.kind for p in acct.phases if p.seconds > 0}
    return [kind for kind in _COLORS if kind in had]


def plot_timeline(acct: GoodputAccount, path: str, title: str = "") -> str:
    """A PNG of the run: step reached over time, and lanes of what each second went to.

    The legend names only the kinds of time the run had (no "resize" without a resize).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0 = acct.t0
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(12, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]}
    )
    for keep, color, label in ((True, "#2ca02c", "step (kept)"), (False, "#ff7f0e", "re-done")):
        pts = [(t - t0, s) for t, s, k in acct.step_points if k == keep]
        if pts:
            top.scatter(*zip(*pts), s=9, color=color, label=label, zorder=3)
    if acct.commits:
        top.scatter(
            [t - t0 for t, _ in acct.commits],
            [s for _, s in acct.commits],
            marker="D",
            s=22,
            facecolors="none",
            edgecolors="#1f77b4",
            label="checkpoint committed",
            zorder=4,
        )
    for f in acct.failures:
        top.axvline(f.t - t0, color="#d62728", ls="--", lw=1)
        top.text(f.t - t0, 0.98, " " + f.how.split(" at ")[0].split(" (")[0], rotation=90,
                 va="top", ha="right", fontsize=7, color="#d62728",
                 transform=top.get_xaxis_transform())  # fmt: skip
    for t, label in acct.resizes:
        top.axvline(t - t0, color="#9467bd", ls=":", lw=1.5)
        top.text(t - t0, 0.02, " resize " + label, rotation=90, va="bottom", ha="right",
                 fontsize=7, color="#9467bd", transform=top.get_xaxis_transform())  # fmt: skip
    top.set_ylabel("global step")
    top.legend(loc="upper left", fontsize=8)
    top.set_title(title or "training under chaos: steps, commits, failures, resizes")
    lanes = {"train": 2, "redone": 2, "blocking": 1, "upload": 1, "restart": 0, "resize": 0,
             "startup": 0, "shutdown": 0}  # fmt: skip
    shown = timeline_kinds(acct)
    for kind, lane in lanes.items():
        spans = [(p.t0 - t0, p.seconds) for p in acct.phases if p.kind == kind and p.seconds > 0]
        if spans:
            h = 0.35 if kind == "upload" else 0.7
            y = lane - (0.45 if kind == "upload" else 0.35)
            bottom.broken_barh(spans, (y, h), facecolors=_COLORS[kind])
    bottom.set_yticks([0, 1, 2], ["start, restarts, exit", "checkpoint", "training"])
    bottom.set_xlabel("seconds since launch")
    bottom.legend(
        handles=[Patch(color=c, label=k) for k, c in _COLORS.items() if k in shown],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.45),
        ncol=8,
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
