"""The seed's own system, ``databricks-sdk-air`` 0.1.1, pointed at a local directory.

    w = air_writer("/tmp/x/step_1")                  # a DCP StorageWriter (UCVolumeWriter)
    r = air_reader("/tmp/x/step_1")                  # a DCP StorageReader (UCVolumeReader)
    loader = air_loader("/tmp/files", batch_size=8, num_workers=2)   # its DataLoader

Its classes accept only paths under ``/Volumes`` (a Unity Catalog FUSE mount); there is none
here, and the benchmark must not create one at the filesystem root. So :class:`RootedLayer`
subclasses its filesystem layer, ``CachingUCFuseFSLayer``, and overrides only the path check
(``_validate_path``): a path must lie under the directory given instead of ``/Volumes``.
Everything else is air's own code, unchanged: the writer stages each file in the layer's
local temp directory (written and fsynced there by torch's ``FileSystemWriter``) and then
copies it to its destination; the reader copies each file into the layer's cache before
reading it; the dataset lists the directory and yields cached local paths. Its classes
build their layer by the module-level name ``CachingUCFuseFSLayer``; ``_rooted`` binds that
name to the rooted layer while one of them is constructed (nothing else is changed).

Install (the project's .venv already has its ``data`` extra's torch and mlflow):
``pip install --no-deps databricks-sdk-air==0.1.1``; benchmarks/peers/setup.sh installs it.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from torch.utils.data import IterableDataset

from benchmarks.peers.contenders import raw_id

__all__ = ["RootedLayer", "air_dataset", "air_loader", "air_reader", "air_writer"]

_PATCH = threading.Lock()  # one constructor at a time sees the rebound name


def _fs_layer_base() -> type:
    try:
        from databricks.air.data.fs_layer import CachingUCFuseFSLayer
    except ImportError as exc:
        raise ImportError(
            "benchmarks.peers.air needs databricks-sdk-air: benchmarks/peers/setup.sh, or "
            "pip install --no-deps databricks-sdk-air==0.1.1 into the project's .venv"
        ) from exc
    return CachingUCFuseFSLayer


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class RootedLayer(_fs_layer_base()):  # type: ignore[misc]
    """air's ``CachingUCFuseFSLayer`` whose paths must lie under ``root``, not ``/Volumes``."""

    def __init__(self, root: str, min_free_disk_bytes: int | None = None) -> None:
        self.root = os.path.abspath(root)
        super().__init__(min_free_disk_bytes)

    def _validate_path(self, path: str) -> None:
        if not _under(os.path.abspath(path), self.root):
            raise ValueError(f"path must lie under {self.root!r}, got {path!r}")


@contextmanager
def _rooted(module: ModuleType, root: str) -> Iterator[None]:
    """``module.CachingUCFuseFSLayer`` is ``RootedLayer(root)`` inside the block."""
    with _PATCH:
        original = module.CachingUCFuseFSLayer
        module.CachingUCFuseFSLayer = functools.partial(RootedLayer, root)
        try:
            yield
        finally:
            module.CachingUCFuseFSLayer = original


def air_writer(directory: str, **kwargs: Any) -> Any:
    """air's ``UCVolumeWriter`` writing to ``directory`` (``kwargs``: FileSystemWriter's)."""
    from databricks.air.data import dcp_storage

    directory = os.path.abspath(directory)
    with _rooted(dcp_storage, directory):
        return dcp_storage.UCVolumeWriter(directory, **kwargs)


def air_reader(directory: str, **kwargs: Any) -> Any:
    """air's ``UCVolumeReader`` of the checkpoint in ``directory``."""
    from databricks.air.data import dcp_storage

    directory = os.path.abspath(directory)
    with _rooted(dcp_storage, directory):
        return dcp_storage.UCVolumeReader(directory, **kwargs)


def air_dataset(directory: str) -> Any:
    """air's ``UCVolumeDataset`` over the files in ``directory`` (yields cached local paths)."""
    from databricks.air.data import uc_volume_dataset

    directory = os.path.abspath(directory)
    with _rooted(uc_volume_dataset, directory):
        return uc_volume_dataset.UCVolumeDataset(directory)


class FileBytes(IterableDataset):
    """Each path air's dataset yields, read at once (air says a path is valid only until the
    next item): ``{"id", "blob"}`` as the data benchmarks' raw rows. It delegates
    ``state_dict``/``load_state_dict`` to the dataset it wraps, as air's ``Checkpointable``
    contract asks of a wrapper, so air's DataLoader still checkpoints."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for path in self.inner:
            with open(path, "rb") as f:
                data = f.read()
            yield {"id": raw_id(path), "blob": torch.frombuffer(bytearray(data), dtype=torch.uint8)}

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


def air_loader(directory: str, batch_size: int, num_workers: int, **kwargs: Any) -> Any:
    """air's checkpoint-aware ``DataLoader`` over :class:`FileBytes` of ``air_dataset``:
    batches of ``{"id", "blob"}``. It pins the world size and worker count it was saved on
    (``load_state_dict`` on another raises ``ValueError``); workers need the fork start."""
    from databricks.air.data import DataLoader

    if num_workers == 0:  # its default prefetch_factor=4 makes torch refuse 0 workers
        kwargs.setdefault("prefetch_factor", None)
    ds = FileBytes(air_dataset(directory))
    return DataLoader(ds, batch_size=batch_size, num_workers=num_workers, **kwargs)
