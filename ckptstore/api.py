"""The user-facing entry points: pick a store from a URL, save and load with DCP.

``writer`` / ``reader`` build DCP storage backends for ``torch.distributed.checkpoint``.
``save`` / ``load`` are thin wrappers over ``dcp.save`` / ``dcp.load`` that unwrap DCP's
``CheckpointException`` (a ``BaseException`` holding every rank's error) into the first
ckptstore error, so callers can ``except IncompleteCheckpointError`` as usual.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ckptstore.config import TransferConfig, WriterOptions, fold_writer_keywords, warn_renamed
from ckptstore.dcp.reader import CkptReader
from ckptstore.dcp.save_load import unwrap_checkpoint_exception
from ckptstore.dcp.writer import CkptWriter
from ckptstore.engine.store import Store
from ckptstore.errors import ConfigError, IncompleteCheckpointError, StateDictMismatchError

__all__ = [
    "writer",
    "reader",
    "save",
    "load",
    "unwrap_checkpoint_exception",
    "empty_state_dict",
]


def writer(
    url: str | Store,
    options: WriterOptions | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    step: int | None = None,
    codec: str | None = None,
    key_layout: str | None = None,
    config: TransferConfig | None = None,
) -> CkptWriter:
    """A DCP ``StorageWriter`` for ``url`` (a path, ``file://``, ``s3://``, ``gs://``, ...),
    writing as ``options`` say (``WriterOptions``: codec, key layout, transfer settings).

    A save refuses a step that is committed already (``CheckpointExistsError``,
    unless ``overwrite``), checked by the coordinator when that save starts, on the URL it
    writes: a writer kept across saves that each name their own ``checkpoint_id`` may be
    built on a directory that holds one. The store is asked once here, so a wrong
    endpoint or credential fails at once (``TransientStoreError`` / ``StoreAccessError``).
    ``WriterOptions(codec="zstd")`` compresses every item in the format of DCP's own
    ``ZStandard`` extension (stock readers load it when ``zstandard`` is installed);
    ``WriterOptions(key_layout="spread")`` spreads the shard files over 256 sub-prefixes,
    for object stores that limit request rates per key prefix (see ``ckptstore.dcp.writer``).
    ``step`` is recorded in the manifest (default: from ``step_<n>``).
    ``codec=``, ``key_layout=`` and ``config=`` (the transfer settings) are the old
    spellings of ``options``' fields: they work until ckptstore 0.2, with a
    ``DeprecationWarning``.
    """
    old = {"codec": codec, "key_layout": key_layout, "config": config}
    options = fold_writer_keywords(
        options,
        {name: value for name, value in old.items() if value is not None},
        "ckptstore.writer(url, WriterOptions({}=...))",
    )
    w = CkptWriter(url, options, storage_options=storage_options, overwrite=overwrite, step=step)
    w.probe()
    return w


def reader(
    url: str | Store,
    *,
    storage_options: dict[str, Any] | None = None,
    transfer: TransferConfig | None = None,
    verify: bool = True,
    allow_pickle: bool = False,
    share_group: Any = None,
    config: TransferConfig | None = None,
) -> CkptReader:
    """A DCP ``StorageReader`` for a committed checkpoint at ``url``.

    Raises ``IncompleteCheckpointError`` at once if ``url`` has no valid commit marker and
    ``CorruptCheckpointError`` if the marker and manifest disagree; every range read is
    checked against the manifest unless ``verify=False``. Object items load only if they
    load with ``weights_only=True`` (else ``UnsafePickleError`` names the item);
    ``allow_pickle=True`` lets DCP unpickle anything, for checkpoints you trust.
    ``share_group``: the process group ``dcp.load`` runs on (e.g. ``dist.group.WORLD``):
    a range several of its ranks need is read from the store by one and sent to the
    others, checked on both ends (``ckptstore.dcp.shared_read``); every rank of it must
    load with this reader. ``transfer``: the transfer settings (``config=``, its old
    spelling, works until ckptstore 0.2, with a ``DeprecationWarning``).
    """
    if config is not None:
        warn_renamed("config", "transfer=")
        transfer = transfer or config
    return CkptReader(
        url,
        storage_options=storage_options,
        config=transfer,
        verify=verify,
        allow_pickle=allow_pickle,
        share_group=share_group,
    )


def save(state_dict: dict[str, Any], url: str | Store | CkptWriter, **kwargs: Any) -> CkptWriter:
    """``dcp.save`` to ``url``; raises the ckptstore error of the first failed rank."""
    from torch.distributed.checkpoint.api import CheckpointException

    from ckptstore.dcp.save_load import save as dcp_save

    w = url if isinstance(url, CkptWriter) else writer(url, **kwargs)
    try:
        dcp_save(state_dict, storage_writer=w)
    except CheckpointException as exc:
        raise unwrap_checkpoint_exception(exc) from exc
    finally:
        w.release_lease()  # a failed save's step lease (a committed one has let it go)
    return w


def load(state_dict: dict[str, Any], url: str | Store | CkptReader, **kwargs: Any) -> None:
    """``dcp.load`` from ``url`` in place; raises the ckptstore error of the first failed rank.

    A state dict that asks for a key the checkpoint lacks, or a tensor of another shape,
    raises ``StateDictMismatchError`` naming the key and both shapes.
    """
    from torch.distributed.checkpoint.api import CheckpointException

    from ckptstore.dcp.save_load import load as dcp_load

    r = url if isinstance(url, CkptReader) else reader(url, **kwargs)
    try:
        dcp_load(state_dict, storage_reader=r)
    except CheckpointException as exc:
        inner = unwrap_checkpoint_exception(exc)
        if isinstance(inner, StateDictMismatchError):
            raise inner from inner.__cause__  # its rank's own error, not every rank's traces
        raise inner from exc


def empty_state_dict(
    url: str | Store, keys: Iterable[str] | None = None, **kwargs: Any
) -> dict[str, Any]:
    """Empty CPU tensors shaped like the tensor items of the checkpoint at ``url`` (all of
    them, or only ``keys``), from its metadata: a state dict to ``load`` it into without
    the objects that saved it. ``kwargs`` go to :func:`reader`.

    ``IncompleteCheckpointError`` if it holds no item of a key; ``ConfigError`` if an item
    asked for is not a tensor.
    """
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = reader(url, **kwargs).read_metadata().state_dict_metadata
    where = url.url if isinstance(url, Store) else url
    wanted = set(meta) if keys is None else set(keys)
    missing = wanted - set(meta)
    if missing:
        raise IncompleteCheckpointError(f"{where} has no item(s) {sorted(missing)}")
    out: dict[str, Any] = {}
    for k in sorted(wanted):
        m = meta[k]
        if not isinstance(m, TensorStorageMetadata):
            raise ConfigError(f"item {k!r} of {where} is not a tensor")
        out[k] = torch.empty(m.size, dtype=m.properties.dtype)
    return out
