"""A small HTTP fault proxy: put it between a client and a real server to inject faults.

    proxy = FaultProxy(server.port).start()
    proxy.add(Rule("UploadPart", "status", status=503, code="SlowDown", times=2))
    proxy.add(Rule("UploadPart", "flip", times=1))          # one bit flipped in transit
    proxy.add(Rule("UploadPart", "stall"))                   # never answers (every call)
    proxy.add(Rule("CompleteMultipartUpload", "drop_response", times=1))
    store = S3Store("s3://bucket/x", {..., "endpoint_url": proxy.endpoint})
    ...
    proxy.requests        # every request seen: Request(op, method, target, size)
    proxy.stop()

Each client connection carries one request (the upstream response says
``Connection: close``), so a fault never leaks into another request. Actions:
``status`` answers with an S3 error document without forwarding; ``stall`` holds the
request and never answers; ``reset`` closes the connection at once (RST);
``drop_response`` forwards it, lets the server act, then closes without an answer (a lost
response); ``truncate`` forwards it but sends back only the first half of the response
body before closing (a connection cut mid-download); ``flip`` flips one bit in the
middle of the body before forwarding;
``strip_conditions`` removes If-None-Match / If-Match (a server that ignores them).
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from dataclasses import dataclass, field

__all__ = ["FaultProxy", "Rule", "Request", "s3_operation"]


@dataclass(frozen=True)
class Request:
    op: str
    method: str
    target: str
    size: int
    headers: dict[str, str] = field(default_factory=dict, compare=False)  # names lowercased


def s3_operation(method: str, target: str) -> str:
    """The S3 API operation of a path-style request (good enough for fault rules)."""
    path, _, query = target.partition("?")
    args = {kv.split("=", 1)[0] for kv in query.split("&") if kv}
    has_key = len([s for s in path.split("/") if s]) >= 2
    if method == "PUT":
        if "partNumber" in args:
            return "UploadPart"
        return "PutObject" if has_key else "CreateBucket"
    if method == "POST":
        if "uploads" in args:
            return "CreateMultipartUpload"
        if "uploadId" in args:
            return "CompleteMultipartUpload"
        return "DeleteObjects" if "delete" in args else "Post"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in args else "DeleteObject"
    if method == "HEAD":
        return "HeadObject" if has_key else "HeadBucket"
    if method == "GET":
        if "uploads" in args:
            return "ListMultipartUploads"
        if "uploadId" in args:
            return "ListParts"
        return "GetObject" if has_key else "ListObjects"
    return method


class Rule:
    """Apply ``action`` to requests for ``op`` (``"*"``: any); ``times`` of them (None: all);
    with ``key_suffix``, only to requests whose path ends with it (e.g. ``"/COMMITTED"``)."""

    def __init__(
        self,
        op: str,
        action: str,
        *,
        times: int | None = None,
        status: int = 503,
        code: str = "SlowDown",
        key_suffix: str = "",
    ) -> None:
        if action not in (
            "status",
            "stall",
            "reset",
            "drop_response",
            "truncate",
            "flip",
            "strip_conditions",
        ):
            raise ValueError(f"unknown action {action!r}")
        self.op, self.action, self.times = op, action, times
        self.status, self.code = status, code
        self.key_suffix = key_suffix
        self.hits = 0

    def take(self, op: str, target: str = "") -> bool:
        if self.op not in ("*", op) or (self.times is not None and self.hits >= self.times):
            return False
        if self.key_suffix and not target.split("?")[0].endswith(self.key_suffix):
            return False
        self.hits += 1
        return True


def _read_head(conn: socket.socket, buf: bytearray) -> bytes | None:
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end])
    del buf[:end]
    return head


def _read_exact(conn: socket.socket, buf: bytearray, n: int) -> bytes:
    while len(buf) < n:
        chunk = conn.recv(max(65536, n - len(buf)))
        if not chunk:
            raise ConnectionError("client closed mid-body")
        buf += chunk
    out = bytes(buf[:n])
    del buf[:n]
    return out


class FaultProxy:
    """See the module docstring."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.rules: list[Rule] = []
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port = int(self._sock.getsockname()[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()
            self.requests.clear()

    def ops(self, op: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.op == op]

    def start(self) -> FaultProxy:
        threading.Thread(target=self._accept, daemon=True, name="fault-proxy").start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def _handle(self, conn: socket.socket) -> None:
        buf = bytearray()
        head = _read_head(conn, buf)
        if head is None:
            return
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = [line for line in lines[1:] if line]
        names = {h.split(":", 1)[0].strip().lower(): h.split(":", 1)[1].strip() for h in headers}
        if names.get("expect", "").lower() == "100-continue":
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if "chunked" in names.get("transfer-encoding", "").lower():
            raise OSError("chunked request bodies are not supported by FaultProxy")
        body = bytearray(_read_exact(conn, buf, int(names.get("content-length", "0"))))
        op = s3_operation(method, target)
        with self._lock:
            self.requests.append(Request(op, method, target, len(body), names))
            rule = next((r for r in self.rules if r.take(op, target)), None)
        action = rule.action if rule else "forward"
        if rule is not None and action == "status":
            xml = (
                f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{rule.code}</Code>"
                f"<Message>injected by FaultProxy</Message></Error>"
            ).encode()
            conn.sendall(
                f"HTTP/1.1 {rule.status} Injected\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(xml)}\r\nConnection: close\r\n\r\n".encode()
                + xml
            )
            return
        if action == "stall":
            while not self._stop.is_set():  # until the client gives up (EOF) or we stop
                readable, _, _ = select.select([conn], [], [], 0.2)
                if readable and not conn.recv(65536):
                    return
            return
        if action == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        if action == "flip" and body:
            body[len(body) // 2] ^= 0x01
        dropped = {"connection", "expect"}
        if action == "strip_conditions":
            dropped |= {"if-none-match", "if-match"}
        kept = [h for h in headers if h.split(":", 1)[0].strip().lower() not in dropped]
        request = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{h}\r\n" for h in kept)
        request += "Connection: close\r\n\r\n"
        with socket.create_connection(self.upstream, timeout=120) as up:
            up.sendall(request.encode("latin-1") + bytes(body))
            response = bytearray()
            while True:
                chunk = up.recv(1 << 20)
                if not chunk:
                    break
                response += chunk
        if action == "drop_response":
            return
        response = bytearray(_force_close(bytes(response)))
        if action == "truncate":
            body_at = response.find(b"\r\n\r\n") + 4
            del response[body_at + (len(response) - body_at) // 2 :]
        conn.sendall(response)


def _force_close(response: bytes) -> bytes:
    """The response with ``Connection: close``, so the client never reuses the connection."""
    end = response.find(b"\r\n\r\n")
    if end < 0:
        return response
    lines = [
        line
        for line in response[:end].split(b"\r\n")
        if not line.lower().startswith(b"connection:")
    ]
    return b"\r\n".join([*lines, b"Connection: close"]) + response[end:]
