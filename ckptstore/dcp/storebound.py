"""What the DCP writer and reader share: the store at a URL, its options, config and engine.

A backend pickles (``dcp.async_save`` with the process executor sends it to another
process): its store is sent as its URL (re-opened there with the same storage_options
and config) or, for a ``Store`` the caller built, as that store object; its engine (a
thread pool and locks) is never sent: the receiving process uses its own shared engine
for the same config.
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
    """A DCP storage backend over one ckptstore store, moved by ``checkpoint_id``.

    Call order (``CkptWriter`` / ``CkptReader`` inherit it, before DCP's base class)::

        self._bind(url, storage_options, config, engine)  in __init__: open the store
        self._rebind(checkpoint_id)                        in reset(): reopen the store if
                                                           DCP names another URL; True if so
        self.url                                           the store's URL
        pickle.dumps(self) / pickle.loads(...)             store and engine re-made in the
                                                           receiving process
    """

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
        if config is None:
            config = engine.config if engine is not None else TransferConfig()
        self.config = config
        self.store = open_store(url, storage_options, retry=self.config.retry)
        self._opened = not isinstance(url, Store)  # re-openable from its URL
        self.engine = engine or TransferEngine.shared(self.config)

    def _rebind(self, checkpoint_id: str | os.PathLike | None) -> bool:
        if not checkpoint_id or str(checkpoint_id).rstrip("/") == self.url:
            return False
        self.store = open_store(str(checkpoint_id), self.storage_options, retry=self.config.retry)
        self._opened = True
        return True

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["engine"]
        if state.pop("_opened", False):
            state["store"] = self.store.url
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._opened = isinstance(self.store, str)
        if self._opened:
            self.store = open_store(self.store, self.storage_options, retry=self.config.retry)
        self.engine = TransferEngine.shared(self.config)

    @property
    def url(self) -> str:
        """The URL of the store this backend reads or writes now."""
        return self.store.url

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        """Always True: any ``checkpoint_id`` is a URL or path for ``open_store``.

        A URL that no store can open raises there, when ``reset`` re-opens the store.
        """
        return True  # any URL or path open_store knows
