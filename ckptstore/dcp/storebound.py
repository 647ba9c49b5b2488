"""What the DCP writer and reader share: the store at a URL, its options, config and engine.

Call order (``CkptWriter`` / ``CkptReader`` inherit it, before DCP's base class)::

    self._bind(url, storage_options, config, engine)   in __init__: open the store
    self._rebind(checkpoint_id)                         in reset(): reopen the store if DCP
                                                        names another URL; True if it did
    self.url                                            the store's URL
"""

from __future__ import annotations

import os
from typing import Any

from ckptstore.config import TransferConfig
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.stores import open_store

__all__ = ["StoreBound"]


class StoreBound:
    """A DCP storage backend over one ckptstore store, moved by ``checkpoint_id``."""

    storage_options: dict[str, Any] | None
    config: TransferConfig
    store: Store
    engine: TransferEngine

    def _bind(
        self,
        url: str | Store,
        storage_options: dict[str, Any] | None,
        config: TransferConfig | None,
        engine: TransferEngine | None,
    ) -> None:
        self.storage_options = storage_options
        self.config = config or TransferConfig()
        self.store = open_store(url, storage_options, retry=self.config.retry)
        self.engine = engine or TransferEngine.shared(self.config)

    def _rebind(self, checkpoint_id: str | os.PathLike | None) -> bool:
        if not checkpoint_id or str(checkpoint_id).rstrip("/") == self.url:
            return False
        self.store = open_store(str(checkpoint_id), self.storage_options, retry=self.config.retry)
        return True

    @property
    def url(self) -> str:
        return self.store.url

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return True  # any URL or path open_store knows
