"""ckptstore in a few minutes: train under torchrun, kill it, resume it, prove it exact.

    python tools/demo.py                  # ~1 min on 2 cores (2 if busy): a clean run, 2 kills
    python tools/demo.py --full           # a kill in every phase of a save, + 2 -> 3 -> 1 resize
    python tools/demo.py --store s3       # to an S3 server it starts (SeaweedFS); saves every 8
    python tools/demo.py --dir ./demo --keep

The job is ``examples/resilience/train.py``: a small causal transformer (3.2 M parameters,
38 MB with its AdamW state) on a generated Parquet token dataset, DDP over 2 gloo processes
under ``torchrun --max-restarts``, with ``CheckpointManager`` (async saves written to a
local tier on local disk and uploaded to the root at once, then committed), ``RNGState``
and the ckptstore ``DataLoader``.

1. reference  the job runs uninterrupted; at each save rank 0 also ``torch.save``s the same
              state (+ fsync), to compare what a save blocks training for.
2. chaos      the same job; ``harness.chaos`` kills a worker during a checkpoint
              upload (a named crash point) and once at a random time (SIGKILL of its pid);
              torchrun restarts the group, which resumes from the newest committed step.
              ``--full``: a kill in every phase of a save, then a resize leg.
3. report     blocking per save (ckptstore vs rank-0 torch.save), restarts survived,
              exactly-once data, bitwise equality with the reference, every committed
              checkpoint verified and loaded in full, and the goodput account measured
              against ``ckptstore.planning.goodput``'s model, with a PNG timeline (written to
              ``demo-output/`` where the demo started, or the ``--dir`` / ``--keep`` one; its
              path is printed).
4. nodes      two simulated nodes (a torchrun agent each); one is replaced whole, and its
              restore is served by the other node's replicas (the peer tier), not the
              store (``demo_nodes``).

Exit status 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import runpy
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from demo_nodes import node_scene  # beside this script

from harness.chaos import ChaosResult, Kill, Segment, run_chaos
from harness.ckptcheck import audit_root
from harness.goodput_report import account, plot_timeline
from harness.runlog import (
    Attempt,
    check_exactly_once,
    check_restores,
    read_attempts,
    same_batches,
    trajectory,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "examples", "resilience", "train.py")
MODEL = ["--d-model", "256", "--layers", "4", "--heads", "4", "--ff", "1024"]


@dataclass(frozen=True)
class Plan:
    steps: int
    kills: tuple[Kill, ...]
    resize: bool
    samples: int = 240  # 20 steps of 12 per epoch
    global_batch: int = 12
    every: int = 4
    keep: int = 3


QUICK = Plan(48, (Kill("mid_upload:2", rank=1), Kill("random")), resize=False)
FULL = Plan(
    96,
    (
        Kill("after_shards:2"),
        Kill("mid_upload:1"),
        Kill("before_marker:1"),
        Kill("after_marker:1"),
        Kill("random"),
        Kill("random"),
    ),
    resize=True,
)


class Demo:
    def __init__(self, root: str, plan: Plan, store: str, seed: int) -> None:
        self.root, self.plan, self.seed = root, plan, seed
        self.data = os.path.join(root, "tokens")
        self.server: Any = None
        self.storage_options: dict[str, Any] = {}
        self.store_label = f"local directory {root}/<run>/ckpt"
        if store == "s3":
            from harness.seaweedfs import SeaweedFS

            self.server = SeaweedFS().start()
            self.server.create_bucket("demo")
            self.storage_options = self.server.storage_options
            self.store_label = f"S3 (SeaweedFS on 127.0.0.1:{self.server.port}) s3://demo/<run>"

    def ckpt_root(self, run: str) -> str:
        if self.server is not None:
            return f"s3://demo/{run}"
        return os.path.join(self.root, run, "ckpt")

    def run(
        self, name: str, segments: list[Segment], *extra: str
    ) -> tuple[ChaosResult, list[Attempt]]:
        d = os.path.join(self.root, name)
        p = self.plan
        args = [
            "--data", self.data, "--cache", os.path.join(self.root, "cache"),
            "--root", self.ckpt_root(name), "--storage-options", json.dumps(self.storage_options),
            "--local-tier", os.path.join(d, "nvme"), "--out", os.path.join(d, "out"),
            "--steps", str(p.steps), "--save-every", str(p.every), "--keep", str(p.keep),
            "--global-batch", str(p.global_batch), *MODEL, *extra,
        ]  # fmt: skip
        result = run_chaos(
            SCRIPT, args, segments, run_dir=d, total_steps=p.steps, seed=self.seed, timeout_s=900
        )
        return result, read_attempts(result.log_dir)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


def example(name: str) -> dict[str, Any]:
    """The names ``examples/resilience/<name>.py`` defines (run as a module, not as __main__)."""
    return runpy.run_path(os.path.join(os.path.dirname(SCRIPT), f"{name}.py"))


def model_size() -> str:
    """'3.2 M-parameter transformer (38 MB with AdamW state)': the demo's model."""
    train = example("train")
    build_model, parse_args = train["build_model"], train["parse_args"]
    n = sum(
        p.numel() for p in build_model(parse_args(["--data=-", "--root=-", *MODEL])).parameters()
    )
    return f"{n / 1e6:.1f} M-parameter transformer ({12 * n / 1e6:.0f} MB with AdamW state)"


def step(text: str) -> float:
    print(text, end=" ", flush=True)
    return time.perf_counter()


def done(t0: float, note: str = "") -> None:
    print(f"done in {time.perf_counter() - t0:.0f} s{note}", flush=True)


def final(d: str, rank: int) -> dict[str, Any]:
    import torch

    return torch.load(os.path.join(d, "out", f"final.rank{rank}.pt"), weights_only=False)


def bitwise_mismatches(a: str, b: str, ranks: int) -> list[str]:
    import torch

    bad = []
    for r in range(ranks):
        x, y = final(a, r), final(b, r)
        bad += [
            f"rank {r} model {k}"
            for k, v in y["model"].items()
            if not torch.equal(x["model"][k], v)
        ]
        for p, st in y["optim"]["state"].items():
            bad += [
                f"rank {r} optim {p}.{k}"
                for k, v in st.items()
                if not torch.equal(x["optim"]["state"][p][k], v)
            ]
        if not torch.equal(x["rng"], y["rng"]):
            bad.append(f"rank {r} rng")
    return bad  # fmt: skip


def relative_l2(a: str, b: str) -> float:
    x, y = final(a, 0)["model"], final(b, 0)["model"]
    diff = sum(((x[k] - v) ** 2).sum() for k, v in y.items()) ** 0.5
    return float(diff / sum((v**2).sum() for v in y.values()) ** 0.5)


def blocking_table(attempts: list[Attempt], where: str) -> list[str]:
    """ckptstore blocking (max over ranks: save() and what the next optimizer step
    waited for the copy staged behind it) vs rank-0 torch.save + fsync, per save."""
    a = attempts[0]
    step_waits = [
        {e["step"]: e.get("step_waited_s", 0.0) for e in a.events("commit", r)} for r in a.ranks
    ]
    per_rank = [
        {e["step"]: e["t1"] - e["t0"] + w.get(e["step"], 0.0) for e in a.events("save", r)}
        for r, w in zip(a.ranks, step_waits)
    ]
    ours = [max(r[s] for r in per_rank) for s in per_rank[0]]
    theirs = [e["seconds"] for e in a.events("torch_save")]
    commits = a.events("commit")
    mb = statistics.median(e["bytes"] for e in commits) / 1e6  # staged per rank
    ts_mb = a.events("torch_save")[0]["bytes"] / 1e6
    med, tmed = statistics.median(ours), statistics.median(theirs)
    waited = statistics.median(e["waited_s"] for e in commits)
    background = statistics.median(e["background_s"] for e in commits)
    lines = [
        f"| what training waits for, per save ({len(ours)} saves) | median ms | min-max ms "
        "| state MB |",
        "| --- | ---: | ---: | ---: |",
        f"| ckptstore `CheckpointManager.save` to {where} (async: the staging copy, the "
        "optimizer's part behind the next step; upload + commit in the background) | "
        f"{1000 * med:.0f} | {1000 * min(ours):.0f}-"
        f"{1000 * max(ours):.0f} | {mb:.1f} |",
        f"| rank-0 `torch.save` + fsync of the same state to local disk (barrier to barrier) | "
        f"{1000 * tmed:.0f} | {1000 * min(theirs):.0f}-{1000 * max(theirs):.0f} | {ts_mb:.1f} |",
    ]
    note = (
        f"ckptstore blocks training {tmed / med:.1f}x less"
        if med < tmed
        else "ckptstore blocked training longer than torch.save here"
    )
    lines.append(
        f"{note}; its background upload + commit took {background:.2f} s (median), overlapped "
        f"with training; waiting for the previous save's upload: {1000 * waited:.0f} ms median"
        + (
            " (uploads slower than the save interval: save less often, or use "
            "CheckpointManager(on_busy='skip'))"
            if waited > 0.2 * med
            else ""
        )
    )
    return lines


def kill_lines(acct: Any, attempts: list[Attempt]) -> list[str]:
    lines = []
    by_id = {a.id: a for a in attempts}
    for i, f in enumerate(acct.failures, 1):
        resumed = f.resumed_from or 0
        cut = [
            e["step"] for e in by_id[f.attempt].events("save") if e["saved"] and e["step"] > resumed
        ]
        where = (
            f"resumed from step {resumed}"
            if f.resumed_from is not None
            else "started over (no checkpoint had committed yet)"
        )
        lines.append(
            f"  kill {i}: {f.how}, during {f.phase}; rank 0 had finished step {f.last_step}. "
            f"torchrun restarted the group in {f.restart_s:.1f} s, {where}"
            + (f"; the cut save of step {cut[-1]} was never restored" if cut else "")
        )
    return lines


def check_run(
    name: str, attempts: list[Attempt], plan: Plan, storage: dict[str, Any], root: str
) -> tuple[bool, list[str]]:
    """Exactly-once, restores, audit of every committed checkpoint; printed lines."""
    data = check_exactly_once(trajectory(attempts), plan.samples, plan.steps)
    restores = check_restores(attempts)
    expected = {e["step"]: e["model_crc"] for a in attempts for e in a.events("save") if e["saved"]}
    crc = example("eventlog")["tensor_crc"]  # what the job logged its saves with
    audit = audit_root(root, storage_options=storage or None, expected=expected, crc=crc)
    n_restore = sum(1 for _, s in restores.restores if s is not None)
    epochs = "; ".join(
        f"epoch {e}: {n} seen, {rep} repeated, {mis} missed" for e, n, rep, mis in data.epochs
    )
    empty = f" ({len(audit.empty)} emptied prefixes still listed by the server)"
    audit_ok = audit.ok and not audit.torn
    return data.ok and restores.ok and audit_ok, [
        f"exactly-once ({name}): {data.samples} samples over {plan.steps} steps, {epochs} -> "
        + ("OK" if data.ok else "FAILED: " + "; ".join(data.problems)),
        f"restores ({name}): {n_restore}, each loaded exactly the state saved at its step "
        "(model+optimizer checksum and data cursor) -> "
        + ("OK" if restores.ok else "FAILED: " + "; ".join(restores.problems)),
        f"checkpoints ({name}): {len(audit.committed)} committed kept (KeepLast({plan.keep})): "
        f"steps {', '.join(map(str, audit.committed))}; {audit.bytes_verified / 1e6:.0f} MB "
        "re-read against their CRC32C manifests, each loaded in full and equal to the state "
        f"saved at its step; {len(audit.torn)} torn left"
        + (empty if audit.empty else "")
        + " -> "
        + ("OK" if audit_ok else f"FAILED: torn {audit.torn}; " + "; ".join(audit.problems)),
    ]


def resize_leg(demo: Demo, plan: Plan, root: str, png_dir: str) -> tuple[bool, list[str]]:
    """Stop on 2 processes, go on on 3 (with a random kill), finish on 1; compare with
    uninterrupted runs on 2 and 3 processes (no dropout: per-rank streams cannot carry over
    a world-size change). How far apart two uninterrupted runs on 2 and 3 processes end is
    the noise of reduction order alone; the resized run must stay within 3x of it."""
    t = step(
        "\nresize leg: uninterrupted runs on 2 and 3 processes, then 2 -> 3 -> 1 with a kill ..."
    )
    _, ref = demo.run("reference-nodrop", [Segment(2)], "--dropout", "0")
    demo.run("reference-3procs", [Segment(3)], "--dropout", "0")
    third = plan.steps // 3
    segments = [
        Segment(2, stop_at_step=third),
        Segment(3, kills=(Kill("random"),), stop_at_step=2 * third),
        Segment(1),
    ]
    resize, attempts = demo.run("resize", segments, "--dropout", "0")
    done(t)
    rel = relative_l2(f"{root}/resize", f"{root}/reference-nodrop")
    floor = relative_l2(f"{root}/reference-3procs", f"{root}/reference-nodrop")
    close = rel <= max(3 * floor, 5e-4)
    same = same_batches(trajectory(attempts), trajectory(ref), per_rank=False) == []
    passed, more = check_run(
        "resize", attempts, plan, demo.storage_options, demo.ckpt_root("resize")
    )
    worlds = " -> ".join(str(a.world) for a in attempts)
    png = plot_timeline(
        account(resize, attempts, plan.every),
        os.path.join(png_dir, "ckptstore-demo-resize-timeline.png"),
        "ckptstore demo: resize 2 -> 3 -> 1 processes, with a kill",
    )
    return passed and same and close, [
        f"resize: attempts on {worlds} processes; the same global batch at every step as the "
        f"uninterrupted run -> {'OK' if same else 'FAILED'}",
        f"resize: ||w - w_ref|| / ||w_ref|| = {rel:.1e}; uninterrupted runs on 3 and 2 "
        f"processes differ by {floor:.1e} (reduction order alone); within 3x -> "
        + ("OK" if close else "FAILED"),
        *more,
        f"resize timeline: {png}",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--full", action="store_true", help="every save phase killed, + resize")
    p.add_argument("--store", choices=("local", "s3"), default="local")
    p.add_argument("--dir", default="", help="working directory (default: a fresh temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    p.add_argument("--seed", type=int, default=1, help="seeds the random kills")
    a = p.parse_args(argv)
    if a.dir and os.path.exists(a.dir) and os.listdir(a.dir):
        print(f"{a.dir} is not empty; pass an empty or new directory", file=sys.stderr)
        return 2
    root = os.path.abspath(a.dir) if a.dir else tempfile.mkdtemp(prefix="ckptstore-demo-")
    os.makedirs(root, exist_ok=True)
    plan = FULL if a.full else QUICK
    if a.store == "s3":  # uploads to a SeaweedFS on the same 2 cores take 1-2 s per save
        plan = dataclasses.replace(plan, every=8)
    # The timeline outlives a removed run directory: demo-output/ where the demo was started
    # (`make demo`: beside the Makefile), or the kept run directory.
    png_dir = root if (a.dir or a.keep) else os.path.abspath("demo-output")
    os.makedirs(png_dir, exist_ok=True)
    t_start = time.perf_counter()
    demo: Demo | None = None
    ok = True
    try:
        t = step("starting the store ..." if a.store == "s3" else "writing the dataset ...")
        try:
            demo = Demo(root, plan, a.store, a.seed)
        except RuntimeError as exc:  # the store did not start: the harness says why
            print(f"\nthe demo's store did not start: {exc}", file=sys.stderr)
            return 2
        write_dataset = example("tokens")["write_dataset"]
        write_dataset(demo.data, samples=plan.samples, shards=6)
        done(t)
        print(
            f"ckptstore demo: a {model_size()} on "
            f"{plan.samples} Parquet token samples, {plan.steps} steps of a global batch of "
            f"{plan.global_batch}, DDP on 2 gloo processes under torchrun; a checkpoint every "
            f"{plan.every} steps to {demo.store_label}, through a local tier on local disk"
        )
        t = step("1/3 uninterrupted reference run ...")
        _, ref = demo.run("reference", [Segment(2)], "--torch-save-dir", f"{root}/torch-save")
        done(t)
        t = step(f"2/3 the same run with {len(plan.kills)} kills (torchrun --max-restarts "
                 f"{len(plan.kills)}) ...")  # fmt: skip
        chaos, attempts = demo.run("chaos", [Segment(2, kills=plan.kills)])
        done(t)
        acct = account(chaos, attempts, plan.every)
        png = plot_timeline(
            acct,
            os.path.join(png_dir, "ckptstore-demo-timeline.png"),
            f"ckptstore demo: {len(plan.kills)} kills under torchrun, resumed exactly",
        )
        where = "S3" if a.store == "s3" else "a local directory"
        lines = ["", "3/3 report", "", *blocking_table(ref, where), ""]
        lines.append(
            f"restarts survived: {len(acct.failures)} (torchrun restarted the worker group "
            "after each kill; the newest committed checkpoint was restored)"
        )
        lines += kill_lines(acct, attempts)
        mismatch = bitwise_mismatches(f"{root}/chaos", f"{root}/reference", 2)
        traj, ref_traj = trajectory(attempts), trajectory(ref)
        mismatch += [f"batches of step {s}" for s in same_batches(traj, ref_traj, per_rank=True)]
        mismatch += [
            f"loss of step {s}"
            for s in ref_traj.steps
            if s not in traj.effective or traj.effective[s].loss != ref_traj.effective[s].loss
        ]
        ok &= not mismatch
        lines.append(
            "bitwise equal to the uninterrupted run: model, optimizer and RNG state on both "
            "ranks, each rank's batches and the loss at every step -> "
            + ("OK" if not mismatch else "FAILED: " + ", ".join(mismatch[:5]))
        )
        passed, more = check_run(
            "chaos", attempts, plan, demo.storage_options, demo.ckpt_root("chaos")
        )
        ok &= passed
        lines += more
        lines += ["", "goodput of the run with kills (rank 0's clock):", acct.format()]
        lines.append(f"timeline: {png}")
        print("\n".join(lines), flush=True)
        t = step("\nnode scene: two simulated nodes, one replaced ...")
        passed, lines = node_scene(SCRIPT, demo.data, root, plan.global_batch)
        done(t)
        ok &= passed
        print("\n".join(lines), flush=True)
        if plan.resize:
            passed, lines = resize_leg(demo, plan, root, png_dir)
            ok &= passed
            print("\n".join(lines))
    finally:
        if demo is not None:
            demo.close()
        if not a.keep and not a.dir:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"\ndemo took {time.perf_counter() - t_start:.0f} s"
        + (f"; kept {root}" if a.keep or a.dir else "")
        + f"\nRESULT: {'PASSED' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
