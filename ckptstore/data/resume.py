"""A loader's resumable state (:class:`OrderState`) and the check that a resume keeps the order.

:mod:`ckptstore.data.order` re-exports these names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptstore.data.order_checks import DataOrderError, check_cursor, check_int, check_str

__all__ = ["ORDER_STATE_VERSION", "OrderState", "check_resume"]

ORDER_STATE_VERSION = 1


@dataclass(frozen=True)
class OrderState:
    """A loader's whole resumable state: the cursor plus what fixes the order (~100 bytes)."""

    cursor: int
    seed: int
    buckets: int
    fingerprint: str
    shuffle: bool = True

    def __post_init__(self) -> None:
        check_cursor("cursor", self.cursor)
        check_int("seed", self.seed, minimum=None)
        check_int("buckets", self.buckets, minimum=1)
        check_str("fingerprint", self.fingerprint)
        if not isinstance(self.shuffle, bool):
            raise DataOrderError(f"shuffle must be a bool, got {self.shuffle!r}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (with a format version) for a checkpoint."""
        return {
            "version": ORDER_STATE_VERSION,
            "cursor": int(self.cursor),
            "seed": int(self.seed),
            "buckets": int(self.buckets),
            "fingerprint": self.fingerprint,
            "shuffle": self.shuffle,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OrderState:
        """Inverse of :meth:`to_dict`; refuses unknown versions and missing fields."""
        version = data.get("version")
        if version != ORDER_STATE_VERSION:
            raise DataOrderError(
                f"data order state version {version!r} is not supported (this ckptstore "
                f"reads version {ORDER_STATE_VERSION}); load it with the ckptstore that wrote it"
            )
        missing = [
            k for k in ("cursor", "seed", "buckets", "fingerprint", "shuffle") if k not in data
        ]
        if missing:
            raise DataOrderError(f"data order state lacks {', '.join(missing)}")
        return cls(
            cursor=data["cursor"],
            seed=data["seed"],
            buckets=data["buckets"],
            fingerprint=data["fingerprint"],
            shuffle=data["shuffle"],
        )


def check_resume(
    saved: OrderState,
    current: OrderState,
    *,
    allow_seed_change: bool = False,
    allow_dataset_change: bool = False,
) -> OrderState:
    """The state to resume from: ``current``'s order settings at ``saved.cursor``.

    Raises :class:`DataOrderError` naming every difference that would change the order
    (``current.cursor`` is ignored). A changed seed or dataset is accepted only with the
    matching ``allow_*`` option: the stream then continues at the saved cursor in the new
    order, so samples may repeat or be missed. A changed ``buckets`` or ``shuffle`` has no
    override: configure the saved value.
    """
    problems = []
    if saved.fingerprint != current.fingerprint and not allow_dataset_change:
        problems.append(
            f"the dataset fingerprint differs (saved {saved.fingerprint!r}, now "
            f"{current.fingerprint!r}); restore the saved dataset, or pass "
            "allow_dataset_change=True to continue at the saved cursor on this one"
        )
    if saved.seed != current.seed and not allow_seed_change:
        problems.append(
            f"the seed differs (saved {saved.seed}, now {current.seed}); set seed={saved.seed}, "
            "or pass allow_seed_change=True to continue at the saved cursor in the new order"
        )
    if saved.buckets != current.buckets:
        problems.append(
            f"the bucket count differs (saved {saved.buckets}, now {current.buckets}); "
            f"set buckets={saved.buckets}"
        )
    if saved.shuffle != current.shuffle:
        problems.append(
            f"shuffle differs (saved {saved.shuffle}, now {current.shuffle}); "
            f"set shuffle={saved.shuffle}"
        )
    if problems:
        raise DataOrderError("cannot resume the data order exactly: " + "; ".join(problems))
    return OrderState(
        cursor=saved.cursor,
        seed=current.seed,
        buckets=current.buckets,
        fingerprint=current.fingerprint,
        shuffle=current.shuffle,
    )
