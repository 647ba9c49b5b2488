"""Step-rate overhead: what checkpointing costs a training loop's steps/s, per contender.

    python -m benchmarks.checkpoint.step_rate [--world 1,2,4] [--every 1,10] [--state-mib 256]
        [--models demo,sized] [--steps 10] [--blocks 3] [--pairs 5] [--contenders "NAME;..."]
        [--max-minutes M] [--quick] [--device cpu|cuda]
    python -m benchmarks.checkpoint.step_rate --report RESULTS.json...   # merged table, plot

The loop: the demo's causal transformer (``examples/resilience/train.py``, 3.2 M parameters,
37 MiB with AdamW) and a wider one sized to ``--state-mib`` per rank ("sized"), plain DDP
over gloo, AdamW, one torch thread per rank, 6 sequences of 32 tokens per rank and step.
With ``--device cuda`` the model, its optimizer and the batches live on rank r's GPU
(r mod the devices there), the stock stagers pin and copy without blocking, and each
block's time ends with ``torch.cuda.synchronize()``.
Each contender (``step_contenders``) runs in a fresh group of rank processes (never two in
one process), after a warm-up with one save: ``--blocks`` rounds of a block of ``--steps``
steps with no checkpoint (the baseline, in the same run, interleaved so that the machine's
drift falls on both) and one per interval, with a save after every ``every``-th step (the
block's first step, then every ``every``); steps/s is the steps over the slowest rank's
time. overhead = 1 - rate / the run's own baseline rate. A second table says where a save's
cost lands (rank 0's step times by their place in the block, median over blocks, against the
baseline's): in the step that calls ``save()``, the step after it, or the steps after that.
Repeat r runs the contenders, and round b its blocks, in an order rotated by r (+ b). Peak
RSS is per rank (the max over ranks) over the checkpointed segments; "RSS+children" adds the
rank's live child processes (a writer process: ckptstore's ``background="process"``,
DefaultStager's process backend), sampled every 50 ms from the warm-up save on (baseline
blocks included), with their PSS beside it (a shared arena counted once). Writes a Markdown
table, JSON (``benchmarks/results/step_rate-<time>.json``) and
``benchmarks/figures/step_rate.png``. The "copy_ floor" contender saves nothing: a thread
copies the state into buffers kept across saves and the optimizer's step waits for it, the
least any asynchronous save of this state does.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import runpy
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterable
from typing import Any

from benchmarks.checkpoint.step_contenders import CONTENDERS, Job, skip_reason
from benchmarks.common import (
    FIGURES_DIR,
    REPO_ROOT,
    TreeMemory,
    cell,
    current_rss_mib,
    load_average,
    machine_line,
    machine_load,
    markdown_table,
    peak_rss_mib,
    reset_peak,
    rotated,
    write_results,
)

__all__ = ["main", "run_rank", "shape_of", "summarise"]

STAGER = "dcp.async_save + DefaultStager"
MEMORY = ("peak_rss_mib", "rss_mib", "tree_rss_mib", "tree_pss_mib")  # MiB, max over ranks
OURS = ("ckptstore", "ckptstore-process", "ckptstore-no-defer")
TRAIN = os.path.join(REPO_ROOT, "examples", "resilience", "train.py")
BATCH, SEQ = 6, 32
DEMO = {"d_model": 256, "heads": 4, "ff": 1024, "layers": 4}  # tools/demo.py's MODEL


def shape_of(model: str, state_mib: int) -> dict[str, int]:
    """The transformer's shape: the demo's, or d_model 512 with as many layers as make
    ``state_mib`` MiB of parameters + AdamW moments (12 bytes a parameter; >= 1 layer)."""
    if model == "demo":
        return DEMO
    per_layer = 12 * 512 * 512 + 13 * 512  # attention, feed-forward (ff = 4 d), norms
    layers = max(1, round(state_mib * 2**20 / 12 / per_layer))
    return {"d_model": 512, "heads": 8, "ff": 2048, "layers": layers}


def build_model(shape: dict[str, int]) -> Any:
    train = runpy.run_path(TRAIN)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in shape.items()]
    return train["build_model"](train["parse_args"](["--data=-", "--root=-", *flags]))


def run_rank(
    rank: int, world: int, name: str, shape: dict, plan: tuple, root: str, device: str = "cpu"
) -> dict:
    """One contender on this rank: warm-up, then ``blocks`` rounds of a block of ``steps``
    steps per interval (0: no checkpoint), the order rotated from ``first`` round by
    round; steps/s per interval (the slowest rank's time), this rank's milliseconds per
    step by its place in the block (the median over blocks; with ``save()`` where it is
    called; the host's clock, which a GPU's queued kernels outrun), RSS before saving and
    peak, and the peak RSS and PSS of the rank with its child processes."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    intervals, blocks, steps, first = plan
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # Every rank first frees a 16 MiB block: glibc then raises its mmap threshold to it
    # (it does for a freed mmap'd block up to 32 MiB) and serves the training's tensors
    # below it from its heap, whatever the contender. Without it a contender whose first
    # save freed such buffers (ckptstore's) trained the 256 MiB model 10-15 % faster in
    # its no-checkpoint blocks than the others (2.07-2.13 -> 2.36-2.42 steps/s, measured),
    # so the baselines differed by contender.
    block = torch.empty(16 << 20, dtype=torch.uint8)
    del block
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    ids = [dev.index] if dev.type == "cuda" else None
    model = DistributedDataParallel(build_model(shape).to(dev), device_ids=ids)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    pg = dist.new_group(backend="gloo")
    g = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, 64, (BATCH, SEQ), generator=g).to(dev)
    contender = CONTENDERS[name](Job(rank, world, root, model, optim, pg, dev.type))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    done = 0  # steps taken: every save's step number is new

    def train_step() -> None:
        nonlocal done
        optim.zero_grad(set_to_none=True)
        logits = model(tokens)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        with contender.guard():
            optim.step()
        done += 1

    warnings.filterwarnings("ignore", message="Detected an existing checkpoint")  # the slots
    logging.getLogger("ckptstore").setLevel(logging.WARNING)  # no line per commit
    out: dict[str, Any] = {"rate": {}, "params": sum(p.numel() for p in model.parameters())}
    try:
        for _ in range(2):
            train_step()
        out["rss_mib"] = current_rss_mib()  # trained, nothing saved yet
        reset_peak()
        seconds = dict.fromkeys(intervals, 0.0)
        step_s: dict[int, list[list[float]]] = {e: [] for e in intervals}  # per block
        with TreeMemory() as tree:  # the rank and its live children, to the last block
            train_step()  # warm-up: one save allocates the staging buffers
            contender.save(done)
            train_step()
            contender.wait()
            for b in range(blocks):
                for every in rotated(intervals, first + b):
                    sync()
                    dist.barrier()
                    t0 = time.perf_counter()
                    ends = []
                    for i in range(steps):
                        train_step()
                        if every and i % every == 0:
                            contender.save(done)
                        ends.append(time.perf_counter())
                    sync()
                    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    contender.wait()  # durable before the next block (untimed)
                    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                    seconds[every] += float(dt.item())
                    step_s[every].append([b - a for a, b in zip([t0, *ends], ends)])
        out["rate"] = {e: blocks * steps / t for e, t in seconds.items()}
        out["step_ms"] = {
            e: [1000 * statistics.median(block[i] for block in ts) for i in range(steps)]
            for e, ts in step_s.items()
        }
        out["tree_rss_mib"], out["tree_pss_mib"] = tree.peak_rss_mib, tree.peak_pss_mib
    finally:
        contender.close()
    out["peak_rss_mib"] = peak_rss_mib()
    return out


def run_one(world: int, name: str, shape: dict, plan: tuple, base: str, device: str) -> dict:
    """``name`` in fresh rank processes; rank 0's rates and step times and the max over
    ranks of each memory figure."""
    from harness.dist import run_distributed

    root = tempfile.mkdtemp(prefix="run-", dir=base)
    t0 = time.perf_counter()
    try:
        res = run_distributed(
            run_rank, world, name, shape, plan, root, device, timeout=1800, daemon=False
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = {k: res[0][k] for k in ("rate", "step_ms", "params")}
    out["wall_s"] = time.perf_counter() - t0
    for k in MEMORY:
        out[k] = max(r[k] for r in res)
    return out


def summarise(runs: list[dict], every: tuple[int, ...]) -> list[dict]:
    """One row per (world, model, contender, interval): medians over the runs, overhead
    against each run's own baseline, and the ratios the issue's targets name."""
    rows = []
    keys = sorted({(r["world"], r["model"], r["contender"]) for r in runs}, key=str)
    for world, model, name in keys:
        mine = [r for r in runs if (r["world"], r["model"], r["contender"]) == (world, model, name)]
        for e in every:
            over = [1 - r["rate"][e] / r["rate"][0] for r in mine]
            rows.append({
                "world": world, "model": model, "contender": name, "every": e,
                "runs": len(mine),
                "rate": statistics.median(r["rate"][e] for r in mine),
                "base_rate": statistics.median(r["rate"][0] for r in mine),
                "overhead": statistics.median(over), "overhead_min": min(over),
                "overhead_max": max(over),
                **{k: _median(r.get(k) for r in mine) for k in MEMORY},
                "landing_ms": _median_each(landing(r, e) for r in mine),
            })  # fmt: skip
    cells = {(r["world"], r["model"], r["contender"], r["every"]): r for r in rows}
    for r in rows:
        ref = cells.get((r["world"], r["model"], STAGER, r["every"]))
        # An overhead below 0 is noise (the baseline's block ran slower): it counts as 0.
        ok = ref is not None and ref["overhead"] > 0
        r["x_stager"] = max(0.0, r["overhead"]) / ref["overhead"] if ok else None
        r["rss_x_stager"] = r["peak_rss_mib"] / ref["peak_rss_mib"] if ref else None
        pss = (r["tree_pss_mib"], ref and ref["tree_pss_mib"])
        r["pss_x_stager"] = pss[0] / pss[1] if pss[0] and pss[1] else None
    return rows


def landing(run: dict, every: int) -> tuple[float, float, float] | None:
    """Where a save's cost lands, from one run's per-step medians against its baseline's:
    the milliseconds each save adds to the step that calls ``save()`` (the call
    included), to the step after it, and to the steps after that together (medians pass
    over the odd slow step that a block's time counts: their sum is not the overhead);
    None for no checkpoint, an interval under 3 or a run from before per-step times."""
    ms = run.get("step_ms")
    if not ms or every < 3:
        return None
    added = [m - b for m, b in zip(ms[every], ms[0], strict=True)]
    saves = len(added) // every
    own = sum(added[0::every]) / saves
    after = sum(added[1::every]) / saves
    return own, after, sum(added) / saves - own - after


def _median_each(values: Iterable[tuple[float, ...] | None]) -> list[float] | None:
    """Element-wise medians; None where a run lacks the figure."""
    xs = list(values)
    return None if not xs or None in xs else [statistics.median(c) for c in zip(*xs)]


def _median(values: Iterable[float | None]) -> float | None:
    """The median, or None where a run lacks the figure (results from before it)."""
    xs = list(values)
    return None if None in xs else statistics.median(xs)


def table(rows: list[dict]) -> str:
    head = ["ranks", "model", "contender", "ckpt every", "steps/s (median)", "no-ckpt steps/s",
            "overhead % (median)", "min–max %", "÷ DefaultStager's overhead",
            "peak RSS/rank MiB", "peak RSS+children/rank MiB (PSS)",
            "RSS before saving MiB"]  # fmt: skip
    body = [
        [str(r["world"]), r["model"], r["contender"], str(r["every"]), cell(r["rate"]),
         cell(r["base_rate"]), cell(100 * r["overhead"], ".1f"),
         f"{100 * r['overhead_min']:.1f}–{100 * r['overhead_max']:.1f}",
         cell(r["x_stager"]), cell(r["peak_rss_mib"], ".0f"),
         f"{cell(r['tree_rss_mib'], '.0f')} ({cell(r['tree_pss_mib'], '.0f')})",
         cell(r["rss_mib"], ".0f")]
        for r in rows
    ]  # fmt: skip
    return markdown_table(head, "rllrrrrrrrrr", body)


def landing_table(rows: list[dict]) -> str:
    """Where a save's cost lands, per row that has it (``landing``)."""
    head = ["ranks", "model", "contender", "ckpt every", "no-ckpt step ms",
            "ms added per save: its step (save() included)", "the next step",
            "the steps after", "in all"]  # fmt: skip
    body = [
        [str(r["world"]), r["model"], r["contender"], str(r["every"]),
         cell(1000 / r["base_rate"], ".1f"), *(cell(v, ".1f") for v in r["landing_ms"]),
         cell(sum(r["landing_ms"]), ".1f")]
        for r in rows
        if r.get("landing_ms")
    ]  # fmt: skip
    return markdown_table(head, "rllrrrrrr", body) if body else ""


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets, per ckptstore variant: reported, not asserted."""
    lines = []
    for name in OURS:
        mine = [r for r in rows if r["contender"] == name]
        if not mine:
            continue
        ratio = [r["x_stager"] for r in mine if r["x_stager"] is not None]
        ten = [r["overhead"] for r in mine if r["every"] == 10]
        rss = [r["rss_x_stager"] for r in mine if r["rss_x_stager"] is not None]
        pss = [r["pss_x_stager"] for r in mine if r["pss_x_stager"] is not None]
        spread = f"{min(ratio):.2f}–{max(ratio):.2f}" if ratio else "— (no DefaultStager row)"
        lines.append(
            f"{name}: overhead ÷ DefaultStager's {spread} (target <= 0.35 at every cell); "
            f"overhead at every 10 steps up to {cell(100 * max(ten) if ten else None, '.1f')} "
            f"% (target <= 2 %); peak RSS ÷ DefaultStager's up to "
            f"{cell(max(rss, default=None))}, with children's PSS up to "
            f"{cell(max(pss, default=None))} (target <= 1.00)"
        )
    return lines


def report(rows: list[dict]) -> str:
    """The printed report: the overhead table, where a save's cost lands, the targets."""
    parts = [table(rows), landing_table(rows), "\n".join(targets(rows))]
    return "\n\n".join(p for p in parts if p)


def plot(rows: list[dict], path: str) -> str | None:
    """steps/s against the checkpoint interval, a panel per (ranks, model), as a fraction of
    the same runs' no-checkpoint steps/s (1 - the median overhead: the machine's load moves
    the rates themselves 2x between runs); the panel's title gives the median
    no-checkpoint rate. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    panels = sorted({(r["world"], r["model"]) for r in rows}, key=str)
    names = list(dict.fromkeys(r["contender"] for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    for ax, (world, model) in zip(axes[0], panels, strict=True):
        mine = [r for r in rows if (r["world"], r["model"]) == (world, model)]
        base = statistics.median(r["base_rate"] for r in mine)
        ax.axhline(1.0, color="grey", linestyle="--", label="no checkpoint")
        for n, name in enumerate(names):
            pts = sorted((r["every"], 1 - r["overhead"]) for r in mine if r["contender"] == name)
            if pts:
                ax.plot(*zip(*pts), marker="o", color=f"C{n % 10}", label=name)
        ax.set_xscale("log")
        ticks = sorted({r["every"] for r in mine})
        ax.set_xticks(ticks, [str(e) for e in ticks])
        ax.set_xlabel("checkpoint every N steps")
        ax.set_ylabel("steps/s ÷ no-checkpoint steps/s (median)")
        ax.set_title(f"{world} rank(s), {model} model ({base:.2f} steps/s without)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--world", default="1,2,4", help="rank counts (default 1,2,4)")
    p.add_argument("--every", default="1,10", help="checkpoint intervals in steps")
    p.add_argument("--state-mib", type=int, default=256, help="the sized model's state/rank")
    p.add_argument("--models", default="demo,sized", help="demo and/or sized")
    p.add_argument("--steps", type=int, default=10, help="steps a block (a multiple of N)")
    p.add_argument("--blocks", type=int, default=3, help="blocks per interval and run (try 10)")
    p.add_argument("--pairs", type=int, default=5, help="repeats of every contender")
    p.add_argument("--contenders", default=";".join(n for n in CONTENDERS if n != "none"))
    p.add_argument("--dir", default=None, help="where checkpoints go (default: a temp dir)")
    p.add_argument("--max-minutes", type=float, default=0, help="start no repeat after it")
    p.add_argument("--quick", action="store_true", help="2 ranks, 32 MiB, 2 blocks, 2 pairs")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where training runs")
    p.add_argument("--report", nargs="+", help="only the table and plot of these results")
    a = p.parse_args()
    if a.report:  # several runs' rows (e.g. a cell each) as one table and one plot
        runs = []
        for path in a.report:
            with open(path) as f:
                runs += json.load(f)["runs"]
        for run in runs:  # JSON made the intervals strings
            for key in ("rate", "step_ms"):
                if key in run:
                    run[key] = {int(e): v for e, v in run[key].items()}
        rows = summarise(runs, tuple(sorted({e for r in runs for e in r["rate"] if e})))
        print(report(rows))
        print(f"plot: {plot(rows, os.path.join(FIGURES_DIR, 'step_rate.png'))}")
        return
    if a.quick:
        a.world, a.state_mib, a.blocks, a.pairs = "2", 32, 2, 2
    worlds = [int(w) for w in a.world.split(",")]
    every = tuple(int(e) for e in a.every.split(","))
    models = [m.strip() for m in a.models.split(",")]
    if any(a.steps % e for e in every) or not set(models) <= {"demo", "sized"}:
        raise SystemExit("--steps must be a multiple of every interval; --models demo,sized")
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: this torch sees no CUDA device; run it on a GPU")
    names, skipped = [], {}
    for n in (n.strip() for n in a.contenders.split(";") if n.strip()):
        if n not in CONTENDERS:
            raise SystemExit(f"unknown contender {n!r}; choose from {list(CONTENDERS)}")
        reason = skip_reason(n)
        if reason:
            skipped[n] = reason
            print(f"skipped {n}: {reason}")
        else:
            names.append(n)
    before = load_average()
    deadline = time.monotonic() + 60 * a.max_minutes if a.max_minutes else float("inf")
    base = tempfile.mkdtemp(prefix="ckptstore-bench-steprate-", dir=a.dir)
    runs = []
    try:
        for world in worlds:
            for model in models:
                shape = shape_of(model, a.state_mib)
                for r in range(a.pairs):
                    if time.monotonic() > deadline:
                        print(f"--max-minutes reached: {r} repeats of {model} on {world}")
                        break
                    plan = ((0, *every), a.blocks, a.steps, r)
                    for name in rotated(names, r):
                        run = run_one(world, name, shape, plan, base, a.device)
                        run.update(world=world, model=model, contender=name, repeat=r)
                        runs.append(run)
                        print(f"{world} ranks, {model}, {name}, repeat {r}: "
                              + ", ".join(f"every {e}: {v:.2f}/s" for e, v in run["rate"].items())
                              + f" ({run['wall_s']:.0f} s)", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows = summarise(runs, every)
    machine = machine_load(before)
    print(f"\n{machine_line(machine)}\n\n{report(rows)}")
    png = plot(rows, os.path.join(FIGURES_DIR, "step_rate.png"))
    out = write_results(
        "step_rate",
        {"args": vars(a), "machine": machine, "skipped": skipped, "shapes":
         {m: shape_of(m, a.state_mib) for m in models}, "rows": rows, "runs": runs},
    )  # fmt: skip
    plotted = f"; plot: {os.path.relpath(png)}" if png else ""
    print(f"\nraw results: {os.path.relpath(out)}{plotted}")


if __name__ == "__main__":
    main()
