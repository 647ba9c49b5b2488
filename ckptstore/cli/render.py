"""Output for ``ckptstore-tool``: plain-text tables, JSON, sizes, times and progress bars.

Tables and reports go to stdout; progress bars, notes and errors go to stderr, so
``ckptstore-tool ls ROOT --json | jq`` always gets clean JSON. Progress bars (tqdm) appear only
when stderr is a terminal and ``--quiet`` is not given.

Text read from storage (names, manifest ``extra``) may hold terminal controls meant to
rewrite the screen or forge a line. ``safe`` escapes every control character (newlines
too) of a value; ``table`` and ``note`` apply it, and while a command runs
``guarded_output`` puts stdout and stderr behind ``GuardedStream``, which escapes what is
left (every control character but newline and tab, bidirectional overrides) and redacts
credentials (``ckptstore.redact``) in everything printed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import sys
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import IO, Any

from ckptstore.redact import redact

__all__ = [
    "safe",
    "guard",
    "GuardedStream",
    "guarded_output",
    "unguarded",
    "human_bytes",
    "format_time",
    "format_shape",
    "table",
    "dump_json",
    "Progress",
    "note",
]


#: C0 and C1 controls, DEL, line / paragraph separators, bidirectional embeddings,
#: overrides and isolates: what can move the cursor, recolour, hide or reorder text.
_OTHER_CONTROLS = r"\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f"
_ANY_CONTROL = re.compile(r"[\x00-\x1f" + _OTHER_CONTROLS + "]")
_NOT_LAYOUT = re.compile(r"[\x00-\x08\x0b-\x1f" + _OTHER_CONTROLS + "]")  # keeps \n, \t
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    c = match.group(0)
    return _NAMED.get(c) or f"\\u{ord(c):04x}"


def safe(text: Any) -> str:
    r"""``str(text)`` with every control character escaped (``\\n``, ``\\u001b``): a value
    from storage printed this way stays on its line and cannot drive the terminal."""
    return _ANY_CONTROL.sub(_escape, str(text))


def guard(text: Any) -> str:
    """``text`` redacted, its control characters escaped but for newlines and tabs."""
    return _NOT_LAYOUT.sub(_escape, redact(text))


class GuardedStream:
    """A text stream that redacts credentials and escapes control characters (all but
    newline and tab) in what is written, then writes it to ``raw``; everything else
    (``flush``, ``isatty``, ``fileno``, ``encoding``, ...) is ``raw``'s. Dropping it leaves
    ``raw`` open."""

    def __init__(self, raw: IO[str]) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        """Write ``text`` guarded; returns its length as given."""
        self.raw.write(guard(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        """Write each of ``lines`` guarded."""
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


@contextlib.contextmanager
def guarded_output() -> Iterator[None]:
    """stdout and stderr behind ``GuardedStream`` for the duration, restored after."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = GuardedStream(out), GuardedStream(err)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def unguarded(stream: IO[str]) -> IO[str]:
    """The stream under a ``GuardedStream`` (tqdm draws with carriage returns)."""
    return stream.raw if isinstance(stream, GuardedStream) else stream


def human_bytes(n: int | float | None) -> str:
    """``1.5 MiB`` (binary units); ``-`` for None."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_time(ts: float | None) -> str:
    """Local time ``2025-01-31 12:00:00``; ``-`` for None or 0."""
    if not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def format_shape(shape: Sequence[int] | None) -> str:
    """``2x3`` for a shape, ``scalar`` for ``()``, ``-`` when unknown."""
    if shape is None:
        return "-"
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


def table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Collection[int] = ()
) -> str:
    """Columns padded to their widest cell; column numbers in ``right`` are right-aligned."""
    cells = [[safe(c) for c in headers]] + [["" if c is None else safe(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [
            r[i].rjust(widths[i]) if i in right else r[i].ljust(widths[i])
            for i in range(len(headers))
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


def dump_json(obj: Any, stream: IO[str] | None = None) -> None:
    """Write ``obj`` (dataclasses, dicts, lists, scalars) as indented JSON and a newline."""
    stream = stream or sys.stdout
    json.dump(_jsonable(obj), stream, indent=2)
    stream.write("\n")


def note(message: str) -> None:
    """A one-line note on stderr (not part of the output a script parses)."""
    print(safe(message), file=sys.stderr)


class Progress:
    """A thread-safe byte (or item) progress bar on stderr; does nothing when disabled."""

    def __init__(self, total: float | None, desc: str, enabled: bool, unit: str = "B") -> None:
        self._lock = threading.Lock()
        self._bar = None
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:  # the cli extra is optional; work without a bar
                return
            scaled = unit == "B"
            self._bar = tqdm(
                total=total,
                desc=safe(desc),
                unit=unit,
                unit_scale=scaled,
                unit_divisor=1024 if scaled else 1000,
                file=unguarded(sys.stderr),
                leave=False,
                dynamic_ncols=True,
            )

    def update(self, n: float = 1) -> None:
        """Advance the bar by ``n`` (thread-safe; nothing when disabled)."""
        if self._bar is not None:
            with self._lock:
                self._bar.update(n)

    def set_description(self, desc: str) -> None:
        """Set the bar's label (thread-safe; nothing when disabled)."""
        if self._bar is not None:
            with self._lock:
                self._bar.set_description(safe(desc))

    def close(self) -> None:
        """Close the bar (idempotent)."""
        if self._bar is not None:
            with self._lock:
                self._bar.close()
                self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
