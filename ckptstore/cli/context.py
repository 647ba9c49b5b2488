"""What every subcommand shares: storage options, opening URLs, the transfer engine, output mode.

``--storage-option key=value`` (``-o``, repeatable) is the one convention for credentials and
endpoints on every URL: the value is parsed as JSON when it parses (``true``, ``8``,
``{"a": 1}``, ``"123"`` for a string of digits), else kept as a string; dotted keys nest
(``client_kwargs.endpoint_url=http://127.0.0.1:8333`` becomes
``{"client_kwargs": {"endpoint_url": ...}}``). Shared options apply to every URL that is not
a local path; ``--src-option`` / ``--dst-option`` apply to one side only and override.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from ckptstore import Store, TransferConfig, TransferEngine, open_store
from ckptstore.config import MiB
from ckptstore.errors import ConfigError
from ckptstore.stores import split_url

__all__ = [
    "parse_storage_options",
    "merge_options",
    "Context",
    "split_file_url",
    "add_common_arguments",
    "non_negative",
    "positive",
]


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_storage_options(items: list[str] | None) -> dict[str, Any]:
    """``["a=1", "client_kwargs.endpoint_url=http://x"]`` -> ``{"a": 1, "client_kwargs": {..}}``."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"storage option {item!r} is not key=value (e.g. -o anon=true or "
                "-o client_kwargs.endpoint_url=http://127.0.0.1:8333)"
            )
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"storage option {item!r}: {p!r} was already given a value")
            node = child
        node[leaf] = _parse_value(value)
    return out


def merge_options(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``over`` onto ``base`` (nested dicts merge, everything else replaces)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_options(out[k], v)
        else:
            out[k] = v
    return out


def split_file_url(url: str) -> tuple[str, str]:
    """``("s3://b/dir", "model.pt")`` for ``s3://b/dir/model.pt``; local paths made absolute."""
    scheme, rest = split_url(url)
    if scheme in ("file", "local"):
        path = os.path.abspath(os.path.expanduser(rest))
        parent, name = os.path.split(path)
        return parent, name
    head, _, name = url.rstrip("/").rpartition("/")
    if not name or head.endswith(":/"):
        raise ConfigError(f"{url!r} names a bucket, not a file; give the file's full URL")
    return head, name


def _number(text: str, ok: Any, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or not ok(value):
        raise argparse.ArgumentTypeError(f"expected a {what} number, got {text!r}")
    return value


def non_negative(text: str) -> float:
    """argparse type: a finite number >= 0."""
    return _number(text, lambda v: v >= 0, "finite, non-negative")


def positive(text: str) -> float:
    """argparse type: a finite number > 0."""
    return _number(text, lambda v: v > 0, "finite, positive")


@dataclass
class Context:
    """Options every subcommand reads, and the URL -> store helpers built on them."""

    json: bool = False
    quiet: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    side_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    config: TransferConfig = field(default_factory=TransferConfig)
    _engine: TransferEngine | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Context:
        """The context the common flags in ``args`` ask for (bad values raise ``ConfigError``)."""
        kwargs: dict[str, Any] = {}
        part_size_mib = getattr(args, "part_size_mib", None)
        if part_size_mib is not None:
            if not part_size_mib > 0 or part_size_mib * MiB > 2**40:
                raise ConfigError(
                    f"--part-size-mib {part_size_mib:g} is not a part size: give a number of "
                    "MiB above 0 and at most 1 TiB (default 32)"
                )
            kwargs["part_size"] = max(1, int(part_size_mib * MiB))
        concurrency = getattr(args, "concurrency", None)
        if concurrency is not None:
            if concurrency < 1:
                raise ConfigError(f"--concurrency {concurrency} must be 1 or more (default 8)")
            kwargs["concurrency"] = concurrency
        if "part_size" in kwargs:
            kwargs["memory_budget"] = max(TransferConfig().memory_budget, 4 * kwargs["part_size"])
        try:
            config = TransferConfig(**kwargs)
        except ValueError as exc:
            raise ConfigError(f"--part-size-mib / --concurrency: {exc}") from exc
        return cls(
            json=bool(getattr(args, "json", False)),
            quiet=bool(getattr(args, "quiet", False)),
            options=parse_storage_options(getattr(args, "storage_option", None)),
            side_options={
                side: parse_storage_options(getattr(args, f"{side}_option", None))
                for side in ("src", "dst")
            },
            config=config,
        )

    @property
    def progress_enabled(self) -> bool:
        """Whether to draw progress bars: not with ``--quiet`` or ``--json``."""
        return not self.quiet and not self.json

    def options_for(self, url: str, side: str = "") -> dict[str, Any]:
        """Shared options (object stores only) deep-merged with ``side``'s own."""
        scheme, _ = split_url(url)
        base = {} if scheme in ("file", "local") else self.options
        return merge_options(base, self.side_options.get(side, {}))

    def open(self, url: str, side: str = "") -> Store:
        """The store rooted at ``url`` with its storage options."""
        return open_store(url, self.options_for(url, side))

    def open_file(self, url: str, side: str = "") -> tuple[Store, str]:
        """The store holding the single file ``url``, and the file's name in it."""
        parent, name = split_file_url(url)
        return self.open(parent, side), name

    @property
    def engine(self) -> TransferEngine:
        """The transfer engine of this command, made on first use with ``config``."""
        if self._engine is None:
            self._engine = TransferEngine(self.config)
        return self._engine

    def close(self) -> None:
        """Close the engine, if one was made (its threads and buffers)."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None


def add_common_arguments(p: argparse.ArgumentParser, two_sided: bool = False) -> None:
    """Options every subcommand takes (after the subcommand name)."""
    p.add_argument(
        "-o",
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="fsspec storage option for object-store URLs (repeatable; JSON values; dotted "
        "keys nest: client_kwargs.endpoint_url=http://...)",
    )
    if two_sided:
        p.add_argument(
            "--src-option",
            action="append",
            metavar="KEY=VALUE",
            help="storage option for the source URL only (overrides -o)",
        )
        p.add_argument(
            "--dst-option",
            action="append",
            metavar="KEY=VALUE",
            help="storage option for the destination URL only (overrides -o)",
        )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no notes")
    p.add_argument(
        "--part-size-mib",
        type=positive,
        metavar="MIB",
        help="part size for parallel reads and writes (default 32)",
    )
    p.add_argument(
        "--concurrency", type=int, metavar="N", help="parts in flight at once (default 8)"
    )
