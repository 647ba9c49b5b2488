"""Plots of figures already in benchmarks/README.md (nothing is measured here).

``python -m benchmarks.readme_plots`` writes ``figures/step_overhead.png`` (the step-rate
overhead per contender, the report's first table) and ``figures/objstore.png`` (every
object-store row of the suite's full run [S], 512 MiB and 1 GiB; the report's text quotes
the 1 GiB ones). The numbers below are copied from the report: change them there first,
then here, and redraw. ``tests/test_benchmarks_readme.py`` checks the step-rate ones.
"""

from __future__ import annotations

import argparse
import os

__all__ = ["OBJSTORE", "STEP_OVERHEAD", "main"]

FIGURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "figures")

# Step-rate overhead %, median (min, max), every step and every 10 steps, per contender and
# cell: README "Step-rate overhead", the first table.
Cell = tuple[tuple[float, float, float], tuple[float, float, float]]
STEP_OVERHEAD: dict[str, dict[str, Cell]] = {
    'ckptstore, background="thread"': {
        "1 rank, demo": ((38.1, 33.7, 40.2), (9.3, 4.8, 10.2)),
        "1 rank, 256 MiB": ((17.2, 15.1, 19.1), (7.0, 3.6, 9.7)),
        "2 ranks, demo": ((40.5, 37.6, 42.5), (5.9, 5.4, 9.0)),
        "2 ranks, 256 MiB": ((26.3, 25.4, 26.5), (2.3, -1.5, 3.2)),
    },
    'ckptstore, background="process"': {
        "1 rank, demo": ((30.1, 29.1, 37.5), (4.2, -4.5, 11.7)),
        "1 rank, 256 MiB": ((13.1, 12.9, 13.2), (2.5, -0.7, 5.3)),
        "2 ranks, demo": ((39.7, 37.7, 40.6), (8.2, 4.0, 9.7)),
        "2 ranks, 256 MiB": ((24.3, 23.5, 25.1), (4.5, 2.1, 5.4)),
    },
    "dcp.async_save + DefaultStager": {
        "1 rank, demo": ((57.2, 55.9, 59.0), (10.4, 6.8, 19.6)),
        "1 rank, 256 MiB": ((26.3, 24.9, 26.9), (3.3, 2.2, 5.5)),
        "2 ranks, demo": ((49.0, 44.9, 49.8), (12.0, 8.9, 12.9)),
        "2 ranks, 256 MiB": ((36.7, 35.6, 37.8), (6.8, 2.9, 8.0)),
    },
}

# Object store, 2 ranks, the suite's full run: seconds, median (min, max), by
# (operation, link, MiB) and contender.
Span = tuple[float, float, float]
OBJSTORE: dict[tuple[str, str, int], dict[str, Span]] = {
    ("save", "direct", 512): {
        "raw ceiling": (7.678, 7.042, 8.314),
        "Fsspec": (5.180, 4.357, 6.002),
        "ckptstore": (5.603, 5.183, 6.022),
        "s3torchconnector": (6.461, 4.348, 8.574),
    },
    ("save", "shaped", 512): {
        "raw ceiling": (6.764, 6.214, 7.313),
        "Fsspec": (14.262, 14.149, 14.376),
        "ckptstore": (7.289, 6.962, 7.615),
        "s3torchconnector": (7.806, 6.388, 9.224),
    },
    ("load", "direct", 512): {
        "raw ceiling": (1.351, 0.827, 1.876),
        "Fsspec": (3.956, 3.766, 4.147),
        "ckptstore": (1.021, 0.786, 1.256),
        "s3torchconnector": (1.670, 1.057, 2.284),
    },
    ("load", "shaped", 512): {
        "raw ceiling": (2.652, 2.500, 2.803),
        "Fsspec": (46.448, 45.954, 46.942),
        "ckptstore": (3.076, 3.050, 3.102),
        "s3torchconnector": (3.234, 2.824, 3.644),
    },
    ("save", "direct", 1024): {
        "raw ceiling": (9.148, 8.080, 10.214),
        "Fsspec": (12.726, 9.569, 13.405),
        "ckptstore": (10.529, 8.931, 17.211),
        "s3torchconnector": (10.143, 9.495, 13.660),
    },
    ("save", "shaped", 1024): {
        "raw ceiling": (10.434, 10.299, 10.589),
        "Fsspec": (27.990, 26.896, 29.319),
        "ckptstore": (11.995, 11.041, 13.780),
        "s3torchconnector": (14.023, 10.179, 15.377),
    },
    ("load", "direct", 1024): {
        "raw ceiling": (1.518, 1.422, 4.588),
        "Fsspec": (7.994, 7.483, 8.830),
        "ckptstore": (1.486, 1.324, 1.568),
        "s3torchconnector": (3.476, 2.712, 3.862),
    },
    ("load", "shaped", 1024): {
        "raw ceiling": (4.707, 4.226, 4.945),
        "Fsspec": (78.075, 77.400, 79.502),
        "ckptstore": (4.623, 4.455, 5.130),
        "s3torchconnector": (6.568, 5.167, 7.137),
    },
}


def _bars(ax, groups: list[str], series: dict[str, list[Span]], log: bool = False) -> None:
    """Grouped bars, one group per label, one bar per series, min–max as error bars."""
    width = 0.8 / len(series)
    for i, (name, spans) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        med = [s[0] for s in spans]
        err = [[s[0] - s[1] for s in spans], [s[2] - s[0] for s in spans]]
        ax.bar(xs, med, width, yerr=err, capsize=2, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)


def plot_step_overhead(path: str) -> None:
    import matplotlib.pyplot as plt

    cells = list(next(iter(STEP_OVERHEAD.values())))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for k, (ax, title) in enumerate(zip(axes, ("every step", "every 10 steps"), strict=True)):
        series = {name: [row[c][k] for c in cells] for name, row in STEP_OVERHEAD.items()}
        _bars(ax, cells, series)
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_title(f"Step-rate overhead, a checkpoint {title}")
        ax.set_ylabel("overhead % (median, min–max)")
    axes[1].axhline(2, color="grey", linestyle="--", linewidth=0.8, label="target ≤ 2 %")
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_objstore(path: str) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, op in zip(axes, ("save", "load"), strict=True):
        keys = [k for k in OBJSTORE if k[0] == op]
        groups = [
            f"{link}, {mib // 1024} GiB" if mib >= 1024 else f"{link}, {mib} MiB"
            for _, link, mib in keys
        ]
        names = list(OBJSTORE[keys[0]])
        series = {n: [OBJSTORE[k][n] for k in keys] for n in names}
        series = {
            (f"{n}{'Writer' if op == 'save' else 'Reader'}" if n == "Fsspec" else n): v
            for n, v in series.items()
        }
        _bars(ax, groups, series, log=True)
        ax.set_title(f"Object store, 2 ranks: {'save' if op == 'save' else 'verified load'}")
        ax.set_ylabel("seconds (median, min–max; log scale)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=FIGURES, help="where the PNGs go (default: figures/)")
    args = p.parse_args(argv)
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot written")
        return 1
    matplotlib.use("Agg")
    os.makedirs(args.out, exist_ok=True)
    for name, draw in (("step_overhead.png", plot_step_overhead), ("objstore.png", plot_objstore)):
        draw(os.path.join(args.out, name))
        print(os.path.join(args.out, name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
