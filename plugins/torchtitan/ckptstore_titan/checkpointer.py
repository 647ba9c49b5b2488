"""``CkptStoreCheckpointManager``: torchtitan's DCP checkpointer, writing through ckptstore.

torchtitan builds its checkpointer from ``Trainer.Config.checkpoint`` (a
``BaseCheckpointManager.Config``; ``config.checkpoint.build(...)`` makes the class that
declares it), so a config that sets ``checkpoint=CkptStoreCheckpointManager.Config(...)``
gets this class: torchtitan's ``CheckpointManager`` with the same policies (interval,
async modes, model-only last save, exclusions, HF export) where every DCP save goes through
``ckptstore.writer`` and every load through ``ckptstore.reader`` instead of the
``FileSystemWriter`` / ``FsspecWriter`` DCP picks from the path. So each step is committed
(create-only ``COMMITTED`` marker after every rank's files are durable, CRC32C manifest),
"latest" means the newest *committed* step (torchtitan's own scan takes any folder with a
``.metadata``, which a save killed before its marker leaves), a resume falls back past a
step whose bytes fail their checksums, and ``keep_latest_k`` prunes through
``ckptstore.plan_prune`` (never a save in flight, never the newest commit) in a background
thread. Steps are named as ckptstore names them (``step_000000100``), so ``ckptstore-tool``
lists, verifies and copies them. HF safetensors export and import stay torchtitan's own.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

import ckptstore
from ckptstore.config import WriterOptions, fold_writer_keywords
from ckptstore.errors import (
    ConfigError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    NewerFormatError,
    NoLoadableCheckpointError,
    missing_dependency,
    require_version,
)

from ._versions import EXTRA, SUPPORTED

try:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    from torchtitan.components.checkpointer import MODEL, AsyncMode, CheckpointManager
    from torchtitan.tools import filesystem
    from torchtitan.tools.utils import GarbageCollection
except ImportError as exc:  # pragma: no cover - exercised in a test with torchtitan hidden
    raise missing_dependency("torchtitan", EXTRA) from exc
for _name, _spec in SUPPORTED.items():
    require_version(_name, _spec, EXTRA)

__all__ = ["CkptStoreCheckpointManager"]

log = logging.getLogger(__name__)


class CkptStoreCheckpointManager(CheckpointManager):
    """torchtitan's DCP ``CheckpointManager``, saving and loading through ckptstore.

    Use (in a ``config_registry`` function: the one line that changes)::

        checkpoint=CkptStoreCheckpointManager.Config(
            enable=True, folder="s3://bucket/run1", interval=500, async_mode="async"
        )
        # or, keeping every setting of a registered config:
        config = llama3_8b()
        config.checkpoint = CkptStoreCheckpointManager.Config.from_titan(
            config.checkpoint, enable=True, folder="s3://bucket/run1"
        )

    ``folder`` is any ckptstore URL (a path relative to ``dump_folder``, an absolute
    path, ``s3://``, ``gs://``, ``az://``, any fsspec URL); ``initial_load_path`` names a
    committed ckptstore step (``s3://bucket/run0/step_000001000``). torchtitan calls the
    manager as before: ``load(step)`` once, ``save(step, last_step)`` each step,
    ``maybe_wait_for_staging()`` before the optimizer changes the weights, and ``close()``.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        """torchtitan's checkpoint config plus what ckptstore's writer and reader take."""

        storage_options: dict[str, Any] = field(default_factory=dict)
        """fsspec options for an object-store ``folder`` / ``initial_load_path``
        (endpoint, credentials; local paths take none); empty: the environment's
        (``AWS_ENDPOINT_URL``, ...)."""

        enable_plan_caching: bool = True
        """Reuse DCP's save plan while the state's layout is unchanged
        (``DefaultSavePlanner(enable_plan_caching=True)``)."""

        writer: WriterOptions = field(default_factory=WriterOptions)
        """How each step is written, passed to ``ckptstore.writer`` whole: its codec
        (``WriterOptions(codec="zstd")`` compresses every stored item; it needs ``pip
        install 'ckptstore[zstd]'``), key layout and transfer settings."""

        codec: str | None = None
        """Deprecated (until ckptstore 0.2): ``writer=WriterOptions(codec=...)``."""

        allow_pickle: bool = False
        """Load non-tensor items with full unpickling; by default only what
        ``torch.load(weights_only=True)`` loads (a refusal names the item)."""

        @classmethod
        def from_titan(
            cls, checkpoint: CheckpointManager.Config, **changes: Any
        ) -> CkptStoreCheckpointManager.Config:
            """``checkpoint`` (a config registry's ``CheckpointManager.Config``) with its
            every setting, for this class, with ``changes`` (``folder=...``, ...)."""
            kept = {f.name: getattr(checkpoint, f.name) for f in dataclasses.fields(checkpoint)}
            return cls(**{**kept, **changes})

        def __post_init__(self) -> None:
            CheckpointManager.Config.__post_init__(self)  # slots: no zero-argument super()
            if self.codec is not None:  # the old spelling: into writer, with a warning
                self.writer = fold_writer_keywords(
                    self.writer, {"codec": self.codec}, "writer=WriterOptions({}=...)"
                )
                self.codec = None
            if not isinstance(self.writer, WriterOptions):
                raise ConfigError(
                    f"checkpoint.writer must be a ckptstore WriterOptions, got {self.writer!r}"
                )
            if not isinstance(self.storage_options, dict):
                raise ConfigError(
                    f"checkpoint.storage_options must be a dict, got {self.storage_options!r}"
                )

    def __init__(self, config: Config, **components: Any) -> None:
        # torchtitan's purge thread deletes with fsspec's rmtree; this class prunes through
        # ckptstore instead, so the parent is built without one. (mypy sees torchtitan,
        # which has no type information, as Any: not the fields Config inherits.)
        parent = dataclasses.replace(config, keep_latest_k=0)  # type: ignore[call-arg]
        super().__init__(parent, **components)
        if not self.enable:
            return
        self.keep_latest_k = config.keep_latest_k
        self._options = dict(config.storage_options)
        self._writer = config.writer
        self._allow_pickle = config.allow_pickle
        self._replace_through = -1  # a rollback's discarded steps: saved over, up to this
        self._planner = DefaultSavePlanner(enable_plan_caching=config.enable_plan_caching)
        self._root = ckptstore.open_store(self.folder, self._options_for(self.folder))
        self._pruner = ThreadPoolExecutor(1, "ckptstore-prune") if self.keep_latest_k else None
        if self.async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM and not _has_accelerator():
            # torchtitan's stager pins memory and copies non-blocking, which DCP refuses
            # without an accelerator; a CPU run stages into shared memory instead.
            self.stager = DefaultStager(StagingOptions(False, True, True, False))

    def _options_for(self, url: str) -> dict[str, Any] | None:
        """``storage_options`` for an object-store URL; none for a path (a local
        ``folder`` may come with a bucket's ``initial_load_path``)."""
        return self._options if filesystem.is_remote(url) else None

    def _close(self) -> None:
        super()._close()
        pruner = getattr(self, "_pruner", None)
        if pruner is not None:
            pruner.shutdown(wait=True)
            self._pruner = None

    # --- saving --------------------------------------------------------------------------

    @torch.no_grad()
    def dcp_save(
        self,
        state_dict: dict[str, Any],
        checkpoint_id: str,
        async_mode: AsyncMode,
        enable_garbage_collection: bool = False,
        to_hf: bool = False,
    ) -> Any:
        """torchtitan's save dispatch, with ``ckptstore.writer(checkpoint_id)`` as the
        storage writer; an HF safetensors export (``to_hf``) is torchtitan's own."""
        if to_hf:
            return super().dcp_save(
                state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf
            )
        writer = ckptstore.writer(
            checkpoint_id,
            self._writer,
            storage_options=self._options_for(checkpoint_id),
            overwrite=(_step_of(checkpoint_id) or 0) <= self._replace_through,
        )
        kwargs: dict[str, Any] = {"storage_writer": writer, "planner": self._planner}
        ret: Any = None
        if async_mode == AsyncMode.ASYNC:
            ret = dcp.async_save(state_dict, process_group=self.pg, **kwargs)
        elif async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM:
            kwargs.update(
                async_checkpointer_type=AsyncCheckpointerType.PROCESS, async_stager=self.stager
            )
            ret = dcp.async_save(state_dict, process_group=self.pg, **kwargs)
        else:
            try:
                dcp.save(state_dict, **kwargs)
            except CheckpointException as exc:
                raise ckptstore.unwrap_checkpoint_exception(exc) from exc
            finally:
                writer.release_lease()  # a failed save's (a committed one has let it go)
        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
        return ret

    def _wait_for_saving(self) -> None:
        try:
            super()._wait_for_saving()
        except CheckpointException as exc:  # a BaseException: every rank's errors
            raise ckptstore.unwrap_checkpoint_exception(exc) from exc

    def _create_checkpoint_id(self, step: int, folder: str = "") -> str:
        return filesystem.join(folder or self.folder, ckptstore.step_name(step))

    def _purge_stale_checkpoints(self) -> None:
        if self._pruner is not None and dist.get_rank() == 0:
            self._pruner.submit(self._prune).add_done_callback(_log_failure)

    def _prune(self) -> None:
        plan = ckptstore.plan_prune(self._root, ckptstore.KeepLast(self.keep_latest_k))
        ckptstore.apply_prune(self._root, plan)

    # --- loading -------------------------------------------------------------------------

    def dcp_load(
        self, state_dict: dict[str, Any], checkpoint_id: str, from_hf: bool, from_quantized: bool
    ) -> None:
        """Load ``checkpoint_id`` (a committed step) with ``ckptstore.reader``; every range
        is checked against the manifest. HF safetensors (``from_hf``) load as torchtitan
        loads them."""
        if from_hf:
            super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)
            return
        reader = ckptstore.reader(
            checkpoint_id,
            storage_options=self._options_for(checkpoint_id),
            allow_pickle=self._allow_pickle,
        )
        ckptstore.load(state_dict, reader)
        if MODEL in self.states:  # the model's entries are flattened into state_dict
            self.states[MODEL].load_state_dict(state_dict)

    def _roll_back(self, step: int, newest: int) -> None:
        """Resuming from ``step`` below the ``newest`` committed: the steps after it are
        saved again as training reaches them (as torchtitan's own writer overwrites)."""
        if step < newest:
            log.warning(
                "resuming from step %d of %s: its committed steps up to %d are replaced as "
                "training reaches them",
                step,
                self.folder,
                newest,
            )
            self._replace_through = newest

    def _find_load_step(self, folder: str = "") -> int:
        root = ckptstore.open_store(folder, self._options_for(folder)) if folder else self._root
        return next(ckptstore.committed_steps(root, newest_first=True), -1)

    @torch.no_grad()
    def _load(self, step: int = -1) -> bool:
        committed = list(ckptstore.committed_steps(self._root, newest_first=True))
        if step != -1:
            if step not in committed:
                raise IncompleteCheckpointError(
                    f"checkpoint.load_step={step}: {self.folder} holds no committed step "
                    f"{step} (committed: {sorted(committed)[-5:] or 'none'})"
                )
            newest, committed = committed[0], [step]
            self._roll_back(step, newest)
        # Committed steps that fail to load (and those a newer ckptstore wrote, which
        # committed_steps leaves out): all of them refused is an error, never a fresh start.
        refused: list[tuple[int, str]] = []
        for i, found in enumerate(committed):
            checkpoint_id = self._create_checkpoint_id(found)
            log.info("Loading the checkpoint from %s.", checkpoint_id)
            try:
                self.dcp_load(self._states_to_load(found == 0), checkpoint_id, False, False)
            except (CorruptCheckpointError, NewerFormatError) as exc:
                if step != -1:
                    raise
                refused.append((found, str(exc)))
                if i + 1 < len(committed):
                    log.warning("%s; loading the step before it instead", exc)
                    self._roll_back(committed[i + 1], committed[0])
                continue
            GarbageCollection.collect("GC collection for checkpoint loading.")
            return True
        if step == -1:  # committed steps committed_steps leaves out: a newer ckptstore's
            refused += ckptstore.newer_steps(self._root)
        if refused:
            raise NoLoadableCheckpointError.of(self.folder, sorted(refused, reverse=True))
        if self.initial_load_in_hf:  # a fresh folder, HF weights: torchtitan's own path
            return super()._load(step)
        if not self.initial_load_path:
            log.info("No checkpoint was provided, this is a fresh start.")
            return False
        log.info("Loading the initial checkpoint from %s.", self.initial_load_path)
        states = self._states_to_load(self.initial_load_model_only)
        self.dcp_load(states, self.initial_load_path, False, False)
        GarbageCollection.collect("GC collection for checkpoint loading.")
        return True


def _step_of(checkpoint_id: str) -> int | None:
    return ckptstore.parse_step(posixpath.basename(checkpoint_id.rstrip("/")))


def _has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    return bool(accelerator is not None and accelerator.is_available())


def _log_failure(future: Future) -> None:
    exc = future.exception()
    if exc is not None:  # a failed prune is retried at the next save's
        log.warning("pruning old checkpoints failed: %s", exc)
