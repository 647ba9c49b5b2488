"""The benchmark suite: ckptstore vs torch.save, stock DCP, s3torchconnector and the floors.

    python -m benchmarks.suite --config quick      # make bench-quick: < 5 min on 2 cores
    python -m benchmarks.suite --config medium     # 1 GiB, world 1/2/4, both links (~15 min)
    python -m benchmarks.suite --config full       # make bench: adds 4 GiB and 4-rank async
    python -m benchmarks.suite --config my.json --only local,async
    python -m benchmarks.suite --from benchmarks/results/full-<time> --readme   # no run

The scenarios are listed in ``config.py``; each runs one of the benchmarks
(``checkpoint.local``, ``checkpoint.async_save``, ``objstore.save_load`` with its own
SeaweedFS, ``data.loader``) through its ``run()`` and turns its rows into common records
(``scenarios.py``). Contenders alternate inside each script. Output, under
``benchmarks/results/<config>-<timestamp>/``: ``results.json`` (every sample, the config,
the machine), ``report.md`` (medians, min–max, ratios) and PNG plots. ``--readme`` also
writes the report to ``benchmarks/suite_report.md`` and replaces the part of
``benchmarks/README.md`` between the ``suite:begin`` / ``suite:end`` markers with a link to it
and the plots: the README stays a short report, the suite's full tables live beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any

from benchmarks.common import (
    FIGURES_DIR,
    RESULTS_DIR,
    command_line,
    load_average,
    machine_facts,
)
from benchmarks.suite.config import CONFIGS
from benchmarks.suite.report import markdown, plots
from benchmarks.suite.scenarios import RUNNERS

__all__ = ["main", "run_suite"]

README = os.path.join(os.path.dirname(RESULTS_DIR), "README.md")
SUITE_REPORT = os.path.join(os.path.dirname(RESULTS_DIR), "suite_report.md")
BEGIN, END = "<!-- suite:begin -->", "<!-- suite:end -->"


def machine() -> dict[str, Any]:
    """``machine_facts`` plus ``disk``: the volume the scenarios write to (/tmp)."""
    m = machine_facts(df_path="/tmp")
    lines = m.pop("df", "").splitlines()
    df = lines[-1].split() if lines else []
    m["disk"] = f"/tmp on {df[0]} ({df[1]}, {df[2]})" if len(df) > 2 else ""
    return m


def scenario_id(s: dict[str, Any]) -> str:
    parts = [s["kind"]]
    if "size_mib" in s:
        parts.append(f"{s['size_mib']}MiB")
    if "world" in s:
        parts.append(f"w{s['world']}")
    if s["kind"] == "objstore":
        parts.append("+".join(s["links"]))
    if s["kind"] == "data":
        parts.append(" ".join(s.get("args", [])) or "default")
    return " ".join(parts)


def run_suite(config: dict[str, Any], only: set[str] | None = None) -> dict[str, Any]:
    recs: list[dict] = []
    errors: dict[str, str] = {}
    durations: dict[str, float] = {}
    before = load_average()
    t0 = time.perf_counter()
    for s in config["scenarios"]:
        if only and s["kind"] not in only:
            continue
        sid = scenario_id(s)
        print(f"== {sid}", flush=True)
        t = time.perf_counter()
        try:
            opts = {k: v for k, v in s.items() if k != "kind"}
            recs += RUNNERS[s["kind"]](sid, **opts)
        except (Exception, BaseException) as exc:  # noqa: BLE001 - report it, run the rest
            if isinstance(exc, KeyboardInterrupt):
                raise
            traceback.print_exc()
            errors[sid] = f"{type(exc).__name__}: {exc}"[:300]
        durations[sid] = time.perf_counter() - t
        print(f"   {sid}: {durations[sid]:.0f} s", flush=True)
    m = machine()
    m["loadavg_before"] = before
    m["loadavg_after"] = load_average()
    return {
        "config": config,
        "command": command_line(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": m,
        "wall_s": time.perf_counter() - t0,
        "durations_s": durations,
        "errors": errors,
        "records": recs,
    }


def update_readme(report: str, res: dict[str, Any], figs: list[str]) -> None:
    """The run's whole report into ``suite_report.md``; in the README, between the markers,
    only a link to it and the plots (the README is a report of at most 400 lines)."""
    name = res["config"]["name"]
    label = "full" if name == "full" else f"{name} (not the full matrix)"
    with open(SUITE_REPORT, "w") as f:
        f.write(
            f"# The benchmark suite's latest run\n\nConfig **{label}**, {res['date']}, "
            f"`{res['command']}`.\n\n{report}\n"
        )
    embeds = "\n".join(f"![{os.path.basename(p)}](figures/{os.path.basename(p)})" for p in figs)
    section = (
        f"{BEGIN}\nThe suite's latest run (config **{label}**): every row, median and min–max "
        f"in [suite_report.md](suite_report.md).\n\n{embeds}\n{END}"
    )
    with open(README) as f:
        text = f.read()
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = f"{text.rstrip()}\n\n{section}\n"
    with open(README, "w") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="quick", help="quick, medium, full or a JSON file")
    p.add_argument("--only", default="", help="comma list of kinds to run (default: all)")
    p.add_argument("--readme", action="store_true", help="write README's 'Latest full run'")
    p.add_argument(
        "--figures",
        default="save_blocking,throughput",
        help="with --readme: plots copied to benchmarks/figures/ and embedded",
    )
    p.add_argument(
        "--from",
        dest="from_dir",
        default="",
        help="render an earlier run's results.json (report, plots, --readme) without running",
    )
    a = p.parse_args(argv)
    if a.from_dir:
        outdir = a.from_dir
        with open(os.path.join(outdir, "results.json")) as f:
            res = json.load(f)
    else:
        if a.config in CONFIGS:
            config = CONFIGS[a.config]
        else:
            with open(a.config) as f:
                config = json.load(f)
        only = {x for x in a.only.split(",") if x} or None
        res = run_suite(config, only)
        outdir = os.path.join(RESULTS_DIR, f"{config['name']}-{time.strftime('%Y%m%d-%H%M%S')}")
        os.makedirs(outdir, exist_ok=True)
        with open(os.path.join(outdir, "results.json"), "w") as f:
            json.dump(res, f, indent=1)
    report = markdown(res["records"], res)
    with open(os.path.join(outdir, "report.md"), "w") as f:
        f.write(report)
    made = plots(res["records"], outdir)
    print("\n" + report)
    print(
        f"results: {os.path.relpath(outdir)}/ (results.json, report.md, "
        f"{', '.join(os.path.basename(x) for x in made)})"
    )
    if a.readme:
        import shutil

        os.makedirs(FIGURES_DIR, exist_ok=True)
        figs = []
        for want in a.figures.split(","):
            src = os.path.join(outdir, f"{want}.png")
            if os.path.exists(src):
                figs.append(shutil.copy(src, os.path.join(FIGURES_DIR, f"{want}.png")))
        update_readme(report, res, figs)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
