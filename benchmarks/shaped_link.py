"""A shaped link: a TCP proxy that adds latency and caps each connection's bandwidth (and,
optionally, the sum over all connections).

    python -m benchmarks.shaped_link --upstream-port 8333 --link-mbps 200 --link-latency-ms 20
    python -m benchmarks.shaped_link --upstream-port 8333 --link-total-mbps 1000

    link = ShapedLink(upstream_port, mbps=200, latency_ms=20, total_mbps=1000).start()
    client = make_client(endpoint=link.endpoint)       # instead of the server's own port
    ...
    link.stats()       # connections, bytes each way, GETs (``counters=``: for other processes)
    link.stop()

tc/netem needs privileges this machine does not give, so the shaping is done in user space.
Every client connection gets its own upstream connection and, in each direction, a
reader thread and a sender thread joined by a bounded queue:

- **latency**: each chunk the reader takes off the socket is stamped; the sender forwards
  it no earlier than ``latency_ms`` after that. Chunks in flight overlap (a pipe, not a
  stop-and-wait), so a request/response exchange pays about 2 x latency while a long
  stream keeps its rate, as on a real link.
- **bandwidth**: the sender paces bytes through a token bucket of ``mbps`` megabits per
  second (10^6 bit/s) and a burst of one chunk, per connection and per direction: N
  parallel connections get N times the rate, as with a cloud store's per-connection cap.
  With ``total_mbps`` every chunk also reserves its time in one bucket per direction that
  all connections share, so N connections together get at most that rate (a node's NIC
  share or a store's per-client limit), each about 1/N of it when all are busy.
- **back-pressure**: the queue holds at most about one bandwidth-delay product (and at
  least 256 KiB), so a fast sender is slowed by TCP, not buffered without bound.
- **GET requests**: ``count_gets=True`` counts ``GET /`` in the bytes sent upstream (the
  store has no request counter). Exact while no request carries a body (a restore sends
  request heads only); during a save a PUT body could hold those bytes by chance.

Everything runs in daemon threads of the calling process: the link stops by itself when
that process exits, when ``stop()`` is called, or (from the command line) after
``--max-seconds``. It binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import collections
import socket
import sys
import threading
import time
from typing import Any

__all__ = ["ShapedLink", "main"]

#: The most bytes a pipe moves per step (one ``recv``, one ``sendall``). The proxy runs in
#: Python threads under one GIL, so its CPU per byte bounds the link on this 2-core
#: machine before the per-connection caps do: with 64 KiB steps a 2-rank load of 512 MiB
#: got ~180 MB/s through 16-64 connections whatever their number (2026-12-02), which made
#: every client strategy look alike. 256 KiB steps cost a quarter of the Python per byte;
#: at 200 Mbit/s one step is ~10 ms of a connection's rate (the burst the pacing allows).
CHUNK = 256 * 1024


class _Pacer:
    """A token bucket ``burst`` bytes deep filling at ``bytes_per_s`` (0: no limit), kept as
    virtual time (GCRA): ``reserve`` books ``n`` bytes and says when they may go; idle time
    fills the bucket no further than ``burst``. Locked, so that every connection's pipe
    can share one."""

    def __init__(self, bytes_per_s: float, burst: int) -> None:
        self.rate, self.burst = bytes_per_s, burst
        self.free = time.monotonic()  # when the bucket is full again (its virtual clock)
        self.lock = threading.Lock()

    def reserve(self, n: int, earliest: float) -> float:
        """The time (``time.monotonic``, not before ``earliest``) ``n`` bytes may start."""
        if not self.rate:
            return earliest
        with self.lock:
            start = max(earliest, self.free - max(0, self.burst - n) / self.rate)
            self.free = max(start, self.free) + n / self.rate
            return start


class _Pipe:
    """One direction of one connection: reader -> bounded queue -> paced, delayed sender."""

    def __init__(
        self, link: ShapedLink, src: socket.socket, dst: socket.socket, direction: str
    ) -> None:
        self.link, self.src, self.dst, self.direction = link, src, dst, direction
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.queued = 0
        self.cond = threading.Condition()
        self.eof = False
        self.broken = False
        self.tail = b""  # the last bytes sent upstream (a request line cut between chunks)

    def start(self, name: str) -> None:
        threading.Thread(target=self._read, daemon=True, name=f"{name}-rd").start()
        threading.Thread(target=self._send, daemon=True, name=f"{name}-wr").start()

    def _read(self) -> None:
        limit = self.link.queue_limit
        try:
            while True:
                with self.cond:
                    while self.queued >= limit and not self.broken:
                        self.cond.wait(0.5)
                    if self.broken:
                        return
                data = self.src.recv(self.link.chunk)
                if not data:
                    break
                if self.link.count_gets and self.direction == "up":
                    self.link._count_gets(self, data)
                with self.cond:
                    self.queue.append((time.monotonic() + self.link.latency_s, data))
                    self.queued += len(data)
                    self.cond.notify_all()
        except OSError:
            pass
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def _send(self) -> None:
        pacer = _Pacer(self.link.bytes_per_s, self.link.chunk)
        total = self.link.total_pacers[self.direction]
        try:
            while True:
                with self.cond:
                    while not self.queue and not self.eof:
                        self.cond.wait(0.5)
                    if not self.queue:
                        break
                    due, data = self.queue[0]
                start = total.reserve(len(data), pacer.reserve(len(data), due))
                delay = start - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self.dst.sendall(data)
                with self.cond:
                    self.queue.popleft()
                    self.queued -= len(data)
                    self.cond.notify_all()
                self.link._count(self.direction, len(data))
        except OSError:
            with self.cond:
                self.broken = True
                self.cond.notify_all()
        # Pass the half-close on (the other direction may still be talking).
        try:
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self.link._pipe_done(self.src, self.dst)


class ShapedLink:
    """A TCP proxy on 127.0.0.1 to ``upstream``; see the module docstring."""

    def __init__(
        self,
        upstream_port: int,
        *,
        mbps: float = 200.0,
        latency_ms: float = 20.0,
        total_mbps: float | None = None,
        upstream_host: str = "127.0.0.1",
        counters: Any = None,
        chunk: int = CHUNK,
        count_gets: bool = False,
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.chunk = chunk
        #: Optional shared array of ints (e.g. ``multiprocessing.RawArray("q", 3)``) kept at
        #: (bytes up, bytes down[, GET requests]) so that other processes can read them.
        self.counters = counters
        self.count_gets = count_gets
        self._gets = 0
        self.mbps = mbps
        self.bytes_per_s = mbps * 1e6 / 8 if mbps > 0 else 0.0
        self.latency_s = max(0.0, latency_ms / 1000)
        self.total_mbps = total_mbps or 0.0
        total_rate = self.total_mbps * 1e6 / 8 if self.total_mbps > 0 else 0.0
        #: Per direction, the bucket every connection's chunks reserve their time in.
        self.total_pacers = {d: _Pacer(total_rate, chunk) for d in ("up", "down")}
        bdp = int(self.bytes_per_s * self.latency_s) if self.bytes_per_s else 4 << 20
        self.queue_limit = max(256 * 1024, bdp)
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._bytes = {"up": 0, "down": 0}
        self._connections = 0
        self._open: dict[frozenset[int], int] = {}
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(256)
        self.port = int(self._sock.getsockname()[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def describe(self) -> str:
        rate = f"{self.mbps:g} Mbit/s" if self.bytes_per_s else "unlimited"
        total = (
            f", at most {self.total_mbps:g} Mbit/s per direction over all connections"
            if self.total_mbps > 0
            else ""
        )
        return (
            f"{rate} per connection and direction{total}, +{self.latency_s * 1000:g} ms "
            f"one-way ({2 * self.latency_s * 1000:g} ms added round trip)"
        )

    def start(self) -> ShapedLink:
        threading.Thread(target=self._accept, daemon=True, name="shaped-link").start()
        return self

    def stop(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.close()
            except OSError:
                pass

    def __enter__(self) -> ShapedLink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"connections": self._connections, "gets": self._gets, **self._bytes}

    def _count(self, direction: str, n: int) -> None:
        with self._lock:
            self._bytes[direction] += n
            if self.counters is not None:
                self.counters[0 if direction == "up" else 1] += n

    def _count_gets(self, pipe: _Pipe, data: bytes) -> None:
        seen = pipe.tail + data
        n = seen.count(b"GET /")
        pipe.tail = seen[-4:]  # shorter than the pattern: never counted twice
        if n:
            with self._lock:
                self._gets += n
                if self.counters is not None and len(self.counters) > 2:
                    self.counters[2] += n

    def _pipe_done(self, a: socket.socket, b: socket.socket) -> None:
        """Close a connection's two sockets once both of its directions have finished."""
        key = frozenset((id(a), id(b)))
        with self._lock:
            self._open[key] = self._open.get(key, 0) + 1
            if self._open[key] < 2:
                return
            del self._open[key]
            self._conns = [c for c in self._conns if c is not a and c is not b]
        for s in (a, b):
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=30)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._connections += 1
                n = self._connections
                self._conns += [client, server]
            _Pipe(self, client, server, "up").start(f"link{n}-up")
            _Pipe(self, server, client, "down").start(f"link{n}-down")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--upstream-port", type=int, required=True)
    p.add_argument("--upstream-host", default="127.0.0.1")
    p.add_argument("--link-mbps", type=float, default=200.0, help="per connection (0: no cap)")
    p.add_argument("--link-latency-ms", type=float, default=20.0, help="one-way, added")
    p.add_argument(
        "--link-total-mbps", type=float, default=0.0, help="over all connections (0: no cap)"
    )
    p.add_argument("--max-seconds", type=float, default=3600.0, help="stop after this long")
    a = p.parse_args(argv)
    link = ShapedLink(
        a.upstream_port,
        mbps=a.link_mbps,
        latency_ms=a.link_latency_ms,
        total_mbps=a.link_total_mbps,
        upstream_host=a.upstream_host,
    ).start()
    print(f"{link.endpoint} -> {a.upstream_host}:{a.upstream_port}: {link.describe()}")
    try:
        time.sleep(a.max_seconds)
    except KeyboardInterrupt:
        pass
    link.stop()
    print(link.stats())
    return 0


if __name__ == "__main__":
    sys.exit(main())
