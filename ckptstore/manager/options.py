"""``ManagerOptions``: every option of a ``CheckpointManager``, in one frozen, checked value.

Built once (by the caller, or from the manager's keywords) and passed down: the manager,
its save backends and the plugins read their options from it, so a new option is
added here once and reaches every one of them. ``from_keywords`` refuses an unknown
keyword with the list of known ones; an old name (``RENAMED``) still works until
ckptstore 0.2, with a ``DeprecationWarning`` naming the name that replaced it.
The writer's settings are one field, ``writer`` (``WriterOptions``: codec, key layout,
transfer settings), passed on whole; their old keywords (``codec=``, ``key_layout=``,
``config=``) still work until ckptstore 0.2, to the constructor and ``from_keywords``
alike, with a ``DeprecationWarning`` (``config.fold_writer_keywords``).
``SaveOptions`` is the part a save needs, derived from it once by the manager and handed
to the save backends, the writer process and ``save_step`` as one picklable value.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any

from ckptstore.config import WRITER_KEYWORDS, WriterOptions, fold_writer_keywords, warn_renamed
from ckptstore.engine.codec_registry import get_codec
from ckptstore.engine.names import KEY_LAYOUTS
from ckptstore.errors import ConfigError
from ckptstore.manager.retention import KeepLast, RetentionPolicy
from ckptstore.tier.jobs import TierSpec
from ckptstore.tier.replicas import check_replicas

__all__ = ["BACKENDS", "ON_BUSY", "RENAMED", "ManagerOptions", "SaveOptions", "check_budget"]

#: The values of ``background``.
BACKENDS = ("thread", "process", "auto")
#: The values of ``on_busy``.
ON_BUSY = ("wait", "skip")
#: Keywords that were renamed: old name -> new name. The old name still works until
#: ckptstore 0.2, with a ``DeprecationWarning`` naming the new one (``config.warn_renamed``).
RENAMED = {"staging_dir": "local_tier_dir", "remote_every": "root_every"}
#: How a writer setting given the old way is spelled now (``WRITER_KEYWORDS``).
WRITER_SPELLING = "writer=WriterOptions({}=...)"


def check_budget(value: object) -> int | None:
    """``value`` as a staging budget in bytes (None: unbounded); ConfigError if it is not one."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"max_staging_bytes must be a positive number of bytes (or None for no limit), "
            f"not {value!r}"
        )
    return value


@dataclass(frozen=True)
class ManagerOptions:
    """What a ``CheckpointManager`` does; every field is checked when the value is made.

    storage_options: the store's options (credentials, endpoint), as ``open_store`` takes.
    local_tier_dir: the local tier, a directory on node-local disk (NVMe, tmpfs): each
        save lands there first and is uploaded to the root from it, and a restore reads a
        step from its tier copy when this node still holds it. Outside the root. None: no
        local tier. Jobs may share it: each job's copies live in a directory of their own there,
        stamped with the root and run, and no job uses, trims or evicts another's
        (``tier.jobs``); a new run reads the root, not an earlier run's copies
        (pass the same ``run_id`` to continue one run). The manager builds one
        ``LocalTier`` (``ckptstore.tier``) from it and the tier options below.
    keep: retention of committed steps (default ``KeepLast(3)``).
    writer: how each step is written (``WriterOptions``): its codec ("none" or "zstd",
        per item, in DCP's own ``ZStandard`` format), key layout ("flat", or "spread" over
        256 key prefixes for request-rate-limited stores) and transfer settings (parts,
        concurrency, retries: the manager's transfer engine, its restores' too).
    async_save: False writes each save before ``save`` returns.
    on_busy: a save while the previous one is uploading "wait"s for it or is "skip"ped.
    strict: raise a failed background save at the next call even after a first commit.
    grace_period_s: what ``finalize`` may take after a preemption notice.
    handle_sigterm: install a SIGTERM handler that ``preemption_requested`` reports.
    background: "auto" (default: the writer process where this node has room for it and
        the root and state allow, else the thread; the rule is
        ``manager.saving.auto_backend``'s, ``CheckpointManager.background`` says which),
        "thread" or "process" (a writer process per rank).
    allow_pickle: restore unpickles any object item (only for roots you trust).
    max_staging_bytes: host memory a save stages into, at most (None: the whole state).
    defer_staging: staging behind the next step (with ``async_save``): ``save`` copies what
        the next forward and backward may change and returns; the parameters and state of
        the optimizers it finds in the state (an ``Optimizer`` value, or an attribute of one:
        ``AppState``'s, a wrapper's) are copied on the save thread while the next step
        runs, and each of those optimizers' ``step`` waits for that copy first (a step
        pre-hook). A loop that changes those tensors another way calls
        ``CheckpointManager.wait_staged()`` first. A state over ``max_staging_bytes``, or
        without an optimizer, is copied whole before ``save`` returns, as with False.
    run_id: this job's identity (default: from the launcher; see ``engine.owner``).
    replicas: peer nodes that get a copy of each node's local-tier shards after a save
        (the peer tier, ``tier.peers``): a replaced node restores from them, not
        from the root. Only with a local tier and two nodes or more; 0: none.
    replica_rate: bytes/s each node sends to its peers at most (None: as fast as the
        checkpoint group carries them), so that replication leaves training's network.
    tier_limit: bytes a node's local tier may hold (None: no limit). It needs state per
        node x (2 + replicas): one step with its replicas, and the next save's own shards
        written before that step is trimmed. A node that cannot take a step's replicas
        within it takes none, and the next ``save`` raises ``ConfigError`` saying so.
    local_every: a save of a step that is a multiple of it (and not of ``root_every``)
        goes to the local tier alone, with its replicas (``tier.rules.save_tier``);
        a save of any other step is skipped. None: no local-only saves. Needs a local
        tier. A restore takes the newest step complete across the tiers.
    keep_local: steps every node's local tier keeps (the newest that a restore could
        pick: local-only steps and those the root keeps); ``keep`` is the root's.
    root_every: a save of a step that is a multiple of it goes to the root (through the
        local tier when there is one); default every step. ``remote_every`` is its old
        name (a ``DeprecationWarning``, until the next minor version).
    """

    storage_options: Mapping[str, Any] | None = None
    local_tier_dir: str | None = None
    keep: RetentionPolicy = field(default_factory=lambda: KeepLast(3))
    writer: WriterOptions = WriterOptions()
    async_save: bool = True
    on_busy: str = "wait"
    strict: bool = False
    grace_period_s: float = 120.0
    handle_sigterm: bool = False
    background: str = "auto"
    allow_pickle: bool = False
    max_staging_bytes: int | None = None
    defer_staging: bool = True
    run_id: str | None = None
    replicas: int = 1
    replica_rate: int | None = None
    tier_limit: int | None = None
    root_every: int = 1
    local_every: int | None = None
    keep_local: int = 1
    #: The old name of ``root_every`` (deprecated; not a field).
    remote_every: InitVar[int | None] = None

    def __post_init__(self, remote_every: int | None = None) -> None:
        if remote_every is not None:
            warn_renamed("remote_every", "root_every=...")
            object.__setattr__(self, "root_every", remote_every)
        if self.keep is None:  # None means the default, as it does for the keyword
            object.__setattr__(self, "keep", KeepLast(3))
        if self.on_busy not in ON_BUSY:
            raise ConfigError(f"on_busy must be 'wait' or 'skip', not {self.on_busy!r}")
        if self.background not in BACKENDS:
            raise ConfigError(
                f"background must be 'thread', 'process' or 'auto', not {self.background!r}"
            )
        if not isinstance(self.writer, WriterOptions):
            raise ConfigError(f"writer must be a WriterOptions, not {self.writer!r}")
        get_codec(self.writer.codec)  # ConfigError listing the choices
        if self.writer.key_layout not in KEY_LAYOUTS:
            raise ConfigError(
                f"key_layout must be one of {', '.join(map(repr, KEY_LAYOUTS))}, "
                f"not {self.writer.key_layout!r}"
            )
        check_budget(self.max_staging_bytes)
        check_replicas(self.replicas)
        for name, unit in (("replica_rate", "bytes/s"), ("tier_limit", "bytes")):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise ConfigError(
                    f"{name} must be a positive number of {unit} (or None for no limit), "
                    f"not {value!r}"
                )
        for name in ("root_every", "local_every", "keep_local"):
            value = getattr(self, name)
            if (value is not None or name != "local_every") and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigError(f"{name} must be a whole number of steps >= 1, not {value!r}")
        if self.local_every is not None and not self.local_tier_dir:
            raise ConfigError(
                f"local_every={self.local_every} saves steps to the local tier alone, and "
                "there is none: pass local_tier_dir (a directory on node-local disk) too"
            )
        if isinstance(self.grace_period_s, bool) or not (
            isinstance(self.grace_period_s, (int, float)) and self.grace_period_s > 0
        ):
            raise ConfigError(
                f"grace_period_s must be a positive number of seconds, not {self.grace_period_s!r}"
            )

    def refuse_cadences(self, who: str) -> None:
        """Raise ``ConfigError`` when ``local_every`` or ``root_every`` is set: ``who``
        (a trainer plugin) saves every checkpoint its trainer asks for, to the root, so
        that a checkpoint the trainer names always exists where it says."""
        if self.local_every is not None or self.root_every != 1:
            raise ConfigError(
                f"{who} saves every checkpoint its trainer asks for to the root; "
                "local_every / root_every (two cadences) are CheckpointManager's: set the "
                "trainer's own checkpoint interval instead"
            )

    @classmethod
    def from_keywords(
        cls, base: ManagerOptions | None = None, /, **keywords: Any
    ) -> ManagerOptions:
        """``base`` (default: the defaults) with ``keywords`` replacing its fields.

        An unknown keyword is a ``ConfigError`` listing the known ones; an old name
        (``RENAMED``) is taken as its new name, with a ``DeprecationWarning`` (both at
        once: ``ConfigError``); a writer setting given the old way (``codec=``, ...) goes
        into ``writer``, with a ``DeprecationWarning``."""
        known = {f.name for f in dataclasses.fields(cls)}
        if keywords.keys() & WRITER_KEYWORDS.keys():
            writer = keywords.get("writer", (base or cls()).writer)
            keywords["writer"] = fold_writer_keywords(writer, keywords, WRITER_SPELLING)
        for old, new in RENAMED.items():
            if old in keywords:
                if new in keywords:
                    raise ConfigError(
                        f"pass {new}=... alone: {old!r} is its old name, given beside it"
                    )
                warn_renamed(old, f"{new}=...")
                keywords[new] = keywords.pop(old)
        for name in keywords:
            if name not in known:
                raise ConfigError(
                    f"unknown CheckpointManager option {name!r}; the options are "
                    f"{', '.join(sorted(known))}"
                )
        return dataclasses.replace(base or cls(), **keywords)


def _takes_writer_keywords(cls: type[ManagerOptions]) -> type[ManagerOptions]:
    """``ManagerOptions(codec=..., key_layout=..., config=...)``, the old spellings, keep
    working until ckptstore 0.2: folded into ``writer``, with a ``DeprecationWarning``."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: ManagerOptions, *args: Any, **keywords: Any) -> None:
        if keywords.keys() & WRITER_KEYWORDS.keys():
            writer = keywords.get("writer")
            keywords["writer"] = fold_writer_keywords(writer, keywords, WRITER_SPELLING)
        init(self, *args, **keywords)

    setattr(cls, "__init__", __init__)  # noqa: B010 - mypy keeps the dataclass's signature
    return cls


_takes_writer_keywords(ManagerOptions)


@dataclass(frozen=True)
class SaveOptions:
    """What a save needs of ``ManagerOptions`` (see there), made once by the manager.

    Picklable (the writer process of ``background="process"`` gets it), so it holds no
    retention policy or other user object; ``run_id`` is the run identity the manager
    settled on (rank 0's), recorded in each manifest and step lease; ``tier`` where the
    save's tier copy goes (``LocalTier.spec``: the tier's directory and the job, the root
    and that run, whose directory of it the save writes into; None: no local tier).
    """

    storage_options: dict[str, Any] | None = None
    writer: WriterOptions = WriterOptions()
    background: str = "auto"
    max_staging_bytes: int | None = None
    run_id: str | None = None
    tier: TierSpec | None = None

    @classmethod
    def of(
        cls, options: ManagerOptions, run_id: str | None = None, tier: TierSpec | None = None
    ) -> SaveOptions:
        """The save's part of ``options``, with the run identity ``run_id`` and the local
        tier's ``tier`` (``LocalTier.spec``)."""
        return cls(
            storage_options=dict(options.storage_options) if options.storage_options else None,
            writer=options.writer,
            background=options.background,
            max_staging_bytes=options.max_staging_bytes,
            run_id=run_id,
            tier=tier,
        )
