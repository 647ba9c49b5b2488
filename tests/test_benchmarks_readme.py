"""benchmarks/README.md stays a report its reader can act on.

It stays under 400 lines and names no commit; every command it gives names a benchmark
module or a make target that exists; every plot it links exists; every anchor that the
docs (and the report itself) link to is one of its headings; and the step-rate plot's
numbers (``benchmarks/readme_plots.py``) are the report's.
"""

from __future__ import annotations

import glob
import os
import re

from benchmarks.readme_plots import STEP_OVERHEAD

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "benchmarks")
README = os.path.join(BENCH, "README.md")


def text() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def anchors() -> set[str]:
    """GitHub's anchors of the report's headings."""
    out = set()
    for line in text().splitlines():
        m = re.match(r"#+ (.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            out.add(slug)
    return out


def test_a_report_not_a_journal() -> None:
    lines = text().splitlines()
    assert len(lines) <= 400, f"{len(lines)} lines: keep the report under 400"
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text()) if re.search(r"[a-f]", w)]
    hashes = [w for w in hashes if re.search(r"\d", w)]
    assert not hashes, f"commit hashes belong in git, not in the report: {hashes}"


def test_commands_name_what_exists() -> None:
    body = text()
    modules = set(re.findall(r"python -m (benchmarks(?:\.\w+)+)", body))
    assert modules, "the report gives no command"
    for mod in sorted(modules):
        path = os.path.join(REPO, *mod.split("."))
        assert os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__main__.py")), (
            f"{mod} is not a benchmark module"
        )
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as f:
        targets = set(re.findall(r"^([\w-]+):", f.read(), re.M))
    for target in set(re.findall(r"`make ([\w-]+)", body)):
        assert target in targets, f"make {target} is not a Makefile target"
    for script in set(re.findall(r"(benchmarks/[\w/]+\.(?:sh|py))", body)):
        assert os.path.isfile(os.path.join(REPO, script)), script


def test_plots_and_anchors_resolve() -> None:
    body = text()
    for png in set(re.findall(r"\]\((figures/[\w.-]+\.png)\)", body)):
        assert os.path.isfile(os.path.join(BENCH, png)), png
    heads = anchors()
    for a in re.findall(r"\]\(#([\w-]+)\)", body):
        assert a in heads, f"#{a} is not a heading of the report"
    docs = [os.path.join(REPO, "README.md"), *glob.glob(os.path.join(REPO, "docs", "*.md"))]
    for doc in docs:
        with open(doc, encoding="utf-8") as f:
            for a in re.findall(r"benchmarks/README\.md#([\w-]+)", f.read()):
                assert a in heads, f"{os.path.basename(doc)} links to a missing #{a}"


def test_step_overhead_plot_draws_the_reports_figures() -> None:
    body = text()
    for row in STEP_OVERHEAD.values():
        for every1, every10 in row.values():
            cell = " / ".join(
                f"{m} ({lo}–{hi})".replace("-", "−") for m, lo, hi in (every1, every10)
            )
            assert cell in body, f"the plot's {cell} is not in the report"
