"""Test helpers for object-store backends: a parallelism probe and DCP rank bodies.

    probe = ProbeStore(store, before_complete=lambda up: seen.append(count_parts(up)))
    engine.put(probe, "big", data)
    assert probe.max_in_flight >= 2            # parts really overlapped

    run_distributed(dcp_roundtrip_rank, 2, url, storage_options, part_size)

The rank bodies are module-level so ``run_distributed`` can pickle them (by name); each
returns something small the test compares.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ckptstore import WriterOptions
from ckptstore.engine.store import Buffer, Multipart, Part, Store
from ckptstore.testing.faults import FaultyStore

__all__ = [
    "ProbeStore",
    "dcp_roundtrip_rank",
    "dcp_reshard_save_rank",
    "dcp_reshard_load_rank",
    "reshard_tensor",
    "race_put_if_absent",
    "Blackhole",
    "StatusServer",
]


class ProbeStore(FaultyStore):
    """Passes every call through; records how many ``put_part`` calls overlapped.

    The first ``rendezvous`` parts wait (up to ``timeout`` s) until that many are in flight
    together, so overlap is observed by construction rather than by timing luck.
    ``before_complete(upload)`` runs just before ``complete_multipart`` is passed on, to
    look at the server's state while the parts are staged but not yet combined.
    """

    def __init__(
        self,
        inner: Store,
        before_complete: Callable[[Multipart], None] | None = None,
        rendezvous: int = 2,
        timeout: float = 10.0,
    ) -> None:
        super().__init__(inner)
        self.before_complete = before_complete
        self.in_flight = 0
        self.max_in_flight = 0
        self._barrier = threading.Barrier(rendezvous, timeout=timeout) if rendezvous > 1 else None
        self._waits = 0
        self._probe_lock = threading.Lock()

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        with self._probe_lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            wait = self._barrier is not None and self._waits < self._barrier.parties
            self._waits += 1
        try:
            if wait and self._barrier is not None:
                try:
                    self._barrier.wait()
                except threading.BrokenBarrierError:
                    pass  # fewer parts than parties, or no overlap: max_in_flight tells
            return super().put_part(upload, number, offset, data)
        finally:
            with self._probe_lock:
                self.in_flight -= 1

    def complete_multipart(self, upload: Multipart, parts: Sequence[Part]) -> None:
        if self.before_complete is not None:
            self.before_complete(upload)
        super().complete_multipart(upload, parts)


def race_put_if_absent(stores: Sequence[Store], path: str) -> list[int]:
    """Start ``stores[i].put_if_absent(path, b"writer-<i>")`` together; the winners' i."""
    from concurrent.futures import ThreadPoolExecutor

    from ckptstore.errors import CommitConflictError

    barrier = threading.Barrier(len(stores), timeout=30)

    def attempt(i: int) -> int | None:
        barrier.wait()
        try:
            stores[i].put_if_absent(path, f"writer-{i}".encode())
        except CommitConflictError:
            return None
        return i

    with ThreadPoolExecutor(len(stores)) as pool:
        return [i for i in pool.map(attempt, range(len(stores))) if i is not None]


def _state(seed: int = 0) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(96, 512, generator=g),
        "b": torch.randint(0, 1 << 30, (4096,), generator=g, dtype=torch.int64),
        "meta": {"step": 7, "name": "run"},
    }


def _config(part_size: int) -> Any:
    from ckptstore.config import RetryConfig, TransferConfig

    return TransferConfig(
        part_size=part_size,
        concurrency=4,
        memory_budget=max(part_size * 8, 1 << 20),
        retry=RetryConfig(attempts=3, base_backoff_s=0.05),
    )


def dcp_roundtrip_rank(
    rank: int, world_size: int, url: str, options: dict[str, Any], part_size: int
) -> list[str]:
    """Save shared + per-rank state with ckptstore, load all of it; return the mismatches."""
    import torch

    import ckptstore

    state = {**_state(seed=0), f"rank{rank}": _state(seed=rank + 1)["w"]}
    ckptstore.save(
        state, url, storage_options=options, options=WriterOptions(transfer=_config(part_size))
    )
    expected = {
        **_state(seed=0),
        **{f"rank{r}": _state(seed=r + 1)["w"] for r in range(world_size)},
    }
    target: dict[str, Any] = {k: torch.zeros_like(v) for k, v in expected.items() if k != "meta"}
    target["meta"] = {"step": 0, "name": ""}  # DCP loads the leaves a state dict names
    ckptstore.load(target, url, storage_options=options, transfer=_config(part_size))
    bad = [k for k, v in expected.items() if torch.is_tensor(v) and not torch.equal(target[k], v)]
    if target["meta"] != expected["meta"]:
        bad.append("meta")
    return bad


def reshard_tensor() -> Any:
    """The global tensor the reshard test saves (deterministic in every process)."""
    import torch

    g = torch.Generator().manual_seed(1234)
    return torch.randn(64, 300, generator=g)


def _mesh(world_size: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world_size,))


def dcp_reshard_save_rank(
    rank: int, world_size: int, url: str, options: dict[str, Any], part_size: int
) -> int:
    """Each rank saves its row chunk of ``reshard_tensor()`` as a DTensor; returns rows."""
    from torch.distributed.tensor import DTensor, Shard

    import ckptstore

    full = reshard_tensor()
    local = full.chunk(world_size, dim=0)[rank].clone()
    dt = DTensor.from_local(local, _mesh(world_size), [Shard(0)], run_check=False)
    ckptstore.save(
        {"w": dt, "step": 3},
        url,
        storage_options=options,
        options=WriterOptions(transfer=_config(part_size)),
    )
    return int(local.shape[0])


def dcp_reshard_load_rank(
    rank: int, world_size: int, url: str, options: dict[str, Any], part_size: int
) -> bool:
    """Load the DTensor on ``world_size`` ranks; True if this rank's chunk is bitwise equal."""
    import torch
    from torch.distributed.tensor import DTensor, Shard

    import ckptstore

    full = reshard_tensor()
    expected = full.chunk(world_size, dim=0)[rank]
    dt = DTensor.from_local(
        torch.zeros_like(expected), _mesh(world_size), [Shard(0)], run_check=False
    )
    state: dict[str, Any] = {"w": dt, "step": 0}
    ckptstore.load(state, url, storage_options=options, transfer=_config(part_size))
    local = state["w"].to_local()
    same_bits = torch.equal(local.view(torch.int32), expected.contiguous().view(torch.int32))
    return bool(same_bits and state["step"] == 3)


class Blackhole:
    """A TCP listener on 127.0.0.1 that accepts connections and never answers (a stall)."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._held: list[Any] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self._held:
            conn.close()

    def __enter__(self) -> Blackhole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StatusServer:
    """An HTTP server on 127.0.0.1 answering every request with ``status`` and ``body``."""

    def __init__(self, status: int, body: bytes = b"", content_type: str = "application/json"):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                outer.requests += 1
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> StatusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
