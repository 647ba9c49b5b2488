"""Find what a URL holds (DCP checkpoint, torch.save file, safetensors file) and load it.

Every read goes through ckptstore stores and readers, so any URL works and a ckptstore DCP
checkpoint is checked range by range against its manifest as it loads. Entry names are DCP's
flattened names (``model.layers.0.weight``) for every format, so ``diff`` can compare a DCP
checkpoint with a ``torch.save`` file.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

from ckptstore import Store
from ckptstore.cli.context import Context
from ckptstore.errors import (
    CkptStoreError,
    ConfigError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    StoreNotFoundError,
    missing_dependency,
    torch_name,
)
from ckptstore.format import (
    MANIFEST_NAME,
    MARKER_NAME,
    METADATA_NAME,
    CheckpointStatus,
    checkpoint_status,
    open_committed,
)
from ckptstore.stores import split_url

__all__ = [
    "Located",
    "Entry",
    "locate",
    "classify",
    "list_or_missing",
    "missing_error",
    "not_a_folder_error",
    "not_a_checkpoint_error",
    "require_committed",
    "local_path",
    "sniff_format",
    "load_state",
    "dcp_reader",
    "flatten",
    "entries_of",
    "dcp_entries",
    "FILE_FORMATS",
]

FILE_FORMATS = ("torch", "safetensors")


@dataclass(frozen=True)
class Located:
    """A URL resolved: its format and where its bytes are (``name`` for single files)."""

    url: str
    format: str  # dcp | torch | safetensors
    store: Store  # the checkpoint (dcp) or the folder holding the file
    name: str = ""


@dataclass(frozen=True)
class Entry:
    """One state-dict entry as a table row."""

    name: str
    kind: str  # tensor | object
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    nbytes: int | None = None


def is_dcp_listing(names: list[str]) -> bool:
    """Whether a folder listing looks like a (possibly torn) DCP checkpoint."""
    fixed = {MARKER_NAME, METADATA_NAME, MANIFEST_NAME}
    return any(
        n in fixed
        or n.endswith(".distcp")
        or n.startswith(METADATA_NAME + ".")
        or n.startswith("ckptstore.manifest.")
        for n in names
    )


def classify(store: Store) -> str:
    """What ``store`` holds.

    ``committed``, ``corrupt``, ``incomplete``, ``stock``, ``not-a-checkpoint`` or ``missing``
    (nothing there, or its bucket / container does not exist).
    """
    try:
        names = store.listdir()
    except StoreNotFoundError:  # a missing bucket or container holds nothing
        return "missing"
    if not names:
        return "missing"
    if not is_dcp_listing(names):
        return "not-a-checkpoint"
    status = checkpoint_status(store)
    if (
        status == CheckpointStatus.INCOMPLETE
        and MANIFEST_NAME not in names
        and METADATA_NAME in names
    ):
        return CheckpointStatus.STOCK
    return status


def missing_error(url: str, reason: str = "") -> StoreNotFoundError:
    """The usage error for nothing at ``url``; ``reason``: the store's own words, if any."""
    if reason:
        return StoreNotFoundError(f"nothing at {url}: {reason}")
    return StoreNotFoundError(
        f"nothing at {url}: the path, bucket or prefix does not exist or is empty. Check the URL "
        "(and --storage-option for object stores)."
    )


def not_a_folder_error(url: str) -> ConfigError:
    """The usage error for a single file where a folder of checkpoints is needed."""
    return ConfigError(
        f"{url} is a file, not a folder: give the folder holding the step_* checkpoints (or "
        f"one step folder); `ckptstore-tool inspect {url}` shows what the file holds."
    )


def local_path(url: str) -> str | None:
    """The filesystem path of a local ``url`` (a path or ``file://``), else None."""
    scheme, rest = split_url(url)
    return os.path.expanduser(rest) if scheme in ("file", "local") else None


def _is_local_file(url: str) -> bool:
    path = local_path(url)
    return path is not None and os.path.isfile(path)


def list_or_missing(store: Store, url: str) -> list[str]:
    """The names directly under ``store`` (at ``url``), or ``missing_error`` if there are none.

    A missing bucket or container is the same error as an empty prefix or a missing folder,
    with the store's reason (which bucket, at which endpoint) added; a local file is
    ``not_a_folder_error``.
    """
    if _is_local_file(url):
        raise not_a_folder_error(url)
    try:
        names = store.listdir()
    except StoreNotFoundError as exc:
        raise missing_error(url, str(exc)) from None
    if not names:
        raise missing_error(url)
    return names


def not_a_checkpoint_error(url: str, what: str = "checkpoint") -> ConfigError:
    """The usage error for a folder holding nothing of a checkpoint at ``url``."""
    return ConfigError(
        f"{url} is not a {what}: it has no COMMITTED marker, .metadata, manifest or .distcp "
        "shards. Point at one step folder (ckptstore-tool ls ROOT lists them)."
    )


def require_committed(store: Store, url: str, verb: str) -> None:
    """Raise a clear error unless ``store`` holds a committed ckptstore checkpoint."""
    list_or_missing(store, url)  # nothing there: say why (a missing bucket, an empty prefix)
    status = classify(store)
    if status == "missing":  # emptied since
        raise missing_error(url)
    if status == "not-a-checkpoint":
        raise not_a_checkpoint_error(url)
    if status == CheckpointStatus.INCOMPLETE:
        raise IncompleteCheckpointError(
            f"{url} is incomplete (no COMMITTED marker: the save did not finish); refusing to "
            f"{verb} it. `ckptstore-tool ls` shows the committed steps."
        )
    if status == CheckpointStatus.STOCK:
        raise ConfigError(
            f"{url} is a stock DCP checkpoint (no manifest to verify a copy against); use "
            "`ckptstore-tool convert SRC DST --to dcp`, which verifies and adds a manifest."
        )
    if status in (CheckpointStatus.CORRUPT, CheckpointStatus.NEWER):
        open_committed(store)  # raises Corrupt/NewerFormatError with the reason


def sniff_format(head: bytes, name: str) -> str | None:
    """``torch`` / ``safetensors`` from a file's first bytes (and name), else None."""
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        return "torch"
    if len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") > 1:
        return "safetensors"
    lower = name.lower()
    if lower.endswith(".safetensors"):
        return "safetensors"
    if lower.endswith((".pt", ".pth", ".bin", ".ckpt")):
        return "torch"
    return None


def locate(ctx: Context, url: str, side: str = "") -> Located:
    """What ``url`` holds; raises a clear error for nothing there or an unknown file."""
    try:
        parent, name = ctx.open_file(url, side)
        size: int | None = parent.size(name)
    except (StoreNotFoundError, ConfigError):
        size = None
    except CkptStoreError:  # e.g. a parent of the path is a file: the URL is no file
        size = None
    if size is not None:
        fmt = sniff_format(parent.get(name, 0, min(size, 16)), name)
        if fmt is None:
            raise ConfigError(
                f"{url} is a file but not a torch.save or safetensors checkpoint (and a DCP "
                "checkpoint is a folder holding .metadata): point at a .pt / .safetensors file "
                "or a step folder."
            )
        return Located(url, fmt, parent, name)
    store = ctx.open(url, side)
    names = list_or_missing(store, url)
    if not is_dcp_listing(names):
        raise not_a_checkpoint_error(url)
    return Located(url, "dcp", store)


def dcp_reader(ctx: Context, store: Store, note_stock: bool = True) -> Any:
    """ckptstore's verifying ``CkptReader`` over ``store`` (its ``.metadata`` read through
    ``load_metadata`` and checked); notes on stderr that a stock checkpoint is unverified."""
    from ckptstore.format import CkptReader, StockCheckpointWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StockCheckpointWarning)
        reader = CkptReader(store, engine=ctx.engine, config=ctx.config)
    if caught and note_stock and not ctx.quiet:
        from ckptstore.cli.render import note

        note(f"note: {store.url} is a stock DCP checkpoint: no manifest, nothing is verified")
    return reader


def load_state(
    ctx: Context,
    loc: Located,
    *,
    keys: list[str] | None = None,
    allow_pickle: bool = False,
    note_stock: bool = True,
) -> dict[str, Any]:
    """The state dict at ``loc`` (DCP: only ``keys`` when given; nested as it was saved).
    ``note_stock=False``: the caller noted already that a stock checkpoint is unverified.

    Nothing runs pickled code unless ``allow_pickle`` (``ckptstore.cli.safeload``): object
    items and torch.save files load weights-only, ``.metadata`` through DCP's classes only.
    """
    from ckptstore.cli.safeload import load_torch_file

    if loc.format == "dcp":
        from torch.distributed.checkpoint.api import CheckpointException

        from ckptstore.cli.exit_codes import first_failure
        from ckptstore.cli.safeload import SafeLoadPlanner

        with torch_name("DCP's _load_state_dict (torch.distributed.checkpoint)"):
            from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        reader = dcp_reader(ctx, loc.store, note_stock)
        planner = SafeLoadPlanner(
            keys,
            source=loc.url,
            allow_pickle=allow_pickle,
            unverified=reader.committed is None,
        )
        state: dict[str, Any] = {}
        try:
            _load_state_dict(state, storage_reader=reader, planner=planner, no_dist=True)
        except CheckpointException as exc:  # one process: rank 0's error is the error
            raise first_failure(exc) from exc
        return state
    data = bytes(ctx.engine.read(loc.store, loc.name))
    if loc.format == "safetensors":
        return _load_safetensors(data, loc.url)
    state = load_torch_file(data, loc.url, allow_pickle=allow_pickle)
    if not isinstance(state, dict):
        raise ConfigError(
            f"{loc.url} holds a {type(state).__name__}, not a state dict (a dict of tensors and "
            "values); ckptstore-tool works on state dicts."
        )
    return state


def _load_safetensors(data: bytes, url: str) -> dict[str, Any]:
    try:
        from safetensors.torch import load as st_load
    except ImportError as exc:
        raise missing_dependency("safetensors", "cli") from exc
    try:
        return dict(st_load(data))
    except Exception as exc:  # noqa: BLE001 - SafetensorError and friends: a damaged file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CorruptCheckpointError(
            f"{url} is not a readable safetensors file ({first[:200]}): it is truncated, "
            "damaged or another format. Copy it again from where it was written."
        ) from None


def flatten(state: dict[str, Any]) -> dict[str, Any]:
    """DCP's flattened view: ``{"model.w": tensor, "step": 7}``."""
    with torch_name("DCP's _nested_dict.flatten_state_dict (torch.distributed.checkpoint)"):
        from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, _ = flatten_state_dict(state)
    return dict(flat)


def entries_of(flat: dict[str, Any]) -> dict[str, Entry]:
    """Entries of an in-memory flat state dict."""
    import torch

    out = {}
    for name, v in flat.items():
        if isinstance(v, torch.Tensor):
            out[name] = Entry(
                name, "tensor", str(v.dtype).replace("torch.", ""), tuple(v.shape), v.nbytes
            )
        else:
            out[name] = Entry(name, "object")
    return out


def dcp_entries(metadata: Any) -> dict[str, Entry]:
    """Entries of a DCP ``Metadata``, without reading any tensor data."""
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    out = {}
    for name, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            dtype = md.properties.dtype
            numel = 1
            for d in md.size:
                numel *= d
            size = torch.empty((), dtype=dtype).element_size() * numel
            out[name] = Entry(
                name, "tensor", str(dtype).replace("torch.", ""), tuple(md.size), size
            )
        else:
            out[name] = Entry(name, "object")
    return out
