"""Loader metrics and where they go: how long training waited for data, and what it cost.

``fetch_seconds`` is, per batch, the time the training loop spent inside ``next()`` of the
loader: zero when the batch was ready, the stall otherwise. Cache counters (downloads,
bytes, hits, evictions, ...) are summed over the rank's processes: the prefetcher in the
main process and every DataLoader worker (a worker ships its counts with each batch).

Call order::

    m = LoaderMetrics()
    m.record(fetch_s, worker_counts)      # the loader, per batch handed to training
    m.fetch_seconds.p50, m.summary()      # any time
    sink.log(m.window_summary(), step)    # the loader, every ``log_every`` batches

A sink is any object with ``log(metrics: Mapping[str, float], step: int)``:
:class:`LoggingSink` (the ``logging`` module), :class:`ScalarSink` (one call per metric,
``fn(name, value, step)``: TensorBoard's ``SummaryWriter.add_scalar`` fits as it is) and
:class:`MLflowSink` (MLflow metrics; ``mlflow`` is imported only when the sink is created).
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from ckptstore.errors import missing_dependency

__all__ = [
    "FetchSeconds",
    "LoaderMetrics",
    "LoggingSink",
    "MLflowSink",
    "MetricsSink",
    "ScalarSink",
]


class MetricsSink(Protocol):
    """Receives flat ``{name: value}`` metrics at a step (the loader's cursor, in samples)."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` at ``step`` (the cursor, in samples)."""


class FetchSeconds:
    """Per-batch wait times of the training loop, in seconds, with percentiles."""

    def __init__(self, values: array | None = None) -> None:
        self.values = values if values is not None else array("d")

    def __len__(self) -> int:
        return len(self.values)

    def _pct(self, q: float) -> float:
        return (
            float(np.percentile(np.frombuffer(self.values, dtype=np.float64), q))
            if self.values
            else 0.0
        )

    @property
    def p50(self) -> float:
        """Median wait, in seconds (0 before any batch)."""
        return self._pct(50)

    @property
    def p99(self) -> float:
        """99th-percentile wait, in seconds (0 before any batch)."""
        return self._pct(99)

    @property
    def max(self) -> float:
        """Longest wait, in seconds (0 before any batch)."""
        return max(self.values) if self.values else 0.0

    @property
    def total(self) -> float:
        """Sum of the waits, in seconds."""
        return float(sum(self.values))

    def __repr__(self) -> str:
        return (
            f"FetchSeconds(n={len(self)}, p50={self.p50:.4f}, p99={self.p99:.4f}, "
            f"total={self.total:.3f})"
        )


_COUNTERS = (
    "hits",
    "misses",
    "downloads",
    "bytes",
    "download_seconds",
    "wait_seconds",
    "evictions",
    "corrupt",
    "refetches",
)


class LoaderMetrics:
    """One rank's data metrics since its loader was created."""

    def __init__(self) -> None:
        self.fetch_seconds = FetchSeconds()
        self.batches = 0
        self.samples = 0
        self.worker: dict[str, float] = dict.fromkeys(_COUNTERS, 0)
        self.prefetch: dict[str, float] = dict.fromkeys(_COUNTERS, 0)
        self.started = time.monotonic()
        self._window_start = 0
        self._window_t = self.started

    def record(self, fetch_s: float, samples: int, worker_counts: Mapping[str, float]) -> None:
        """Count one batch handed to training: its wait, its samples and its worker's counters."""
        if not self.batches:  # the clock of wait_fraction starts with the first batch's wait
            self.started = self._window_t = time.monotonic() - fetch_s
        self.fetch_seconds.values.append(fetch_s)
        self.batches += 1
        self.samples += samples
        for k, v in worker_counts.items():
            if k in self.worker:
                self.worker[k] += v

    def set_prefetch(self, counts: Mapping[str, float]) -> None:
        """Replace the prefetch thread's counters with ``counts``."""
        for k in _COUNTERS:
            self.prefetch[k] = counts.get(k, 0)

    def _counters(self) -> dict[str, float]:
        both = {k: self.worker[k] + self.prefetch[k] for k in _COUNTERS}
        return {
            "bytes_downloaded": both["bytes"],
            "downloads": both["downloads"],
            "prefetched": self.prefetch["downloads"],
            "cache_hits": self.worker["hits"],
            "cache_misses": self.worker["misses"],
            "evictions": both["evictions"],
            "corrupt_refetched": both["corrupt"],
            "refetches": both["refetches"],
            "download_seconds": both["download_seconds"],
        }

    def summary(self) -> dict[str, float]:
        """Everything since the loader was created, flat (as sinks receive it)."""
        f = self.fetch_seconds
        wall = max(time.monotonic() - self.started, 1e-9)
        return {
            "fetch_seconds_p50": f.p50,
            "fetch_seconds_p99": f.p99,
            "fetch_seconds_max": f.max,
            "fetch_seconds_total": f.total,
            "batches": self.batches,
            "samples": self.samples,
            "wait_fraction": f.total / wall,
            **self._counters(),
        }

    @property
    def window_batches(self) -> int:
        """Batches recorded since the last :meth:`window_summary`."""
        return len(self.fetch_seconds) - self._window_start

    def window_summary(self) -> dict[str, float]:
        """Fetch times of the batches since the previous call, plus running counters."""
        now = time.monotonic()
        window = FetchSeconds(self.fetch_seconds.values[self._window_start :])
        wall = max(now - self._window_t, 1e-9)
        self._window_start, self._window_t = len(self.fetch_seconds), now
        return {
            "fetch_seconds_p50": window.p50,
            "fetch_seconds_p99": window.p99,
            "fetch_seconds_max": window.max,
            "fetch_seconds_total": window.total,
            "wait_fraction": window.total / wall,
            **self._counters(),
        }

    def __repr__(self) -> str:
        c = self._counters()
        return (
            f"LoaderMetrics(batches={self.batches}, {self.fetch_seconds!r}, "
            f"downloads={c['downloads']}, bytes={c['bytes_downloaded']}, "
            f"cache_hits={c['cache_hits']})"
        )


class LoggingSink:
    """Logs each report as one line through ``logging`` (default logger ``ckptstore.data``)."""

    def __init__(self, logger: logging.Logger | None = None, level: int = logging.INFO) -> None:
        self.logger = logger or logging.getLogger("ckptstore.data")
        self.level = level

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Write ``metrics`` to the logger as one line."""
        body = " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()
        )
        self.logger.log(self.level, "data metrics at sample %d: %s", step, body)


class ScalarSink:
    """Calls ``fn(prefix + name, value, step)`` once per metric of each report.

    The shape of TensorBoard's ``SummaryWriter.add_scalar(tag, scalar_value, global_step)``
    (and of most tracker clients)::

        from torch.utils.tensorboard import SummaryWriter
        DataLoader(ds, 32, metrics_sink=ScalarSink(SummaryWriter("runs/x").add_scalar))

    The step is the loader's cursor (global samples), as for every sink.
    """

    def __init__(self, fn: Callable[[str, float, int], object], prefix: str = "data/") -> None:
        self.fn = fn
        self.prefix = prefix

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Call ``fn(prefix + name, value, step)`` once per metric."""
        for k, v in metrics.items():
            self.fn(self.prefix + k, float(v), int(step))


class MLflowSink:
    """Logs metrics to an MLflow run: ``run_id``, else the active run, else a new run.

    ``tracking_uri`` defaults to MLflow's own setting; ``prefix`` is prepended to each
    metric name (``data/fetch_seconds_p50``...). The MLflow step is the loader's cursor (the
    global sample count), so curves continue across resumes on any world size.
    """

    def __init__(
        self,
        run_id: str | None = None,
        *,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        prefix: str = "data/",
    ) -> None:
        try:
            import mlflow
            from mlflow.entities import Metric
        except ImportError as exc:
            raise missing_dependency("mlflow", "data") from exc
        self._metric = Metric
        self.client: Any = mlflow.MlflowClient(tracking_uri=tracking_uri)
        if run_id is None:
            active = mlflow.active_run()
            if active is not None:
                run_id = active.info.run_id
            else:
                exp = self.client.get_experiment_by_name(experiment or "ckptstore-data")
                exp_id = (
                    exp.experiment_id
                    if exp is not None
                    else self.client.create_experiment(experiment or "ckptstore-data")
                )
                run_id = self.client.create_run(exp_id).info.run_id
        self.run_id: str = run_id
        self.prefix = prefix

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Send ``metrics`` to the MLflow run in one ``log_batch`` call."""
        ts = int(time.time() * 1000)
        batch = [self._metric(self.prefix + k, float(v), ts, int(step)) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)
