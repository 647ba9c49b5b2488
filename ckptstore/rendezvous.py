"""``ckptstore-c10d``: torchrun's c10d rendezvous, with node replacement and growth working.

torchrun (torch 2.13-2.14) shares one TCPStore, hosted by rank 0's agent, with the workers,
and its ``DynamicRendezvousHandler`` builds that store's address once per agent process:
a fresh agent that joins a later round (a replaced or added node) as rank != 0 waits for
an address nobody publishes in that round, and one that sorts first starts a second store
the others never learn of (docs/upstream/torch-rendezvous-join.md). This handler forgets
the cached address before every round, so each round's rank 0 starts a store and
publishes it in that round's keys; everything else is the stock handler. The store being
new every round also gives a restarted worker group (``--max-restarts``) one no dead
attempt wrote to, so a script's plain ``dist.init_process_group`` survives restarts (under
the stock handler it can read the dead attempt's gloo addresses: ckptstore/launch.py).
Selected by ``torchrun --rdzv-backend ckptstore-c10d`` (registered in the
``torchrun.handlers`` entry-point group); it takes the same ``--rdzv-endpoint`` and
``--rdzv-conf`` as c10d.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

from ckptstore.errors import TorchVersionError

__all__ = ["BACKEND", "RendezvousVersionError", "create_handler", "handler_creator"]

#: The name torchrun selects this backend by.
BACKEND = "ckptstore-c10d"
#: The stock handler's attributes that cache the workers' store between rounds.
_CACHED = ("_bootstrap_store_info", "_shared_tcp_store_server")


class RendezvousVersionError(TorchVersionError, RuntimeError):
    """This torch's rendezvous handler no longer has what ``ckptstore-c10d`` resets."""


class _PerRoundStoreHandler(DynamicRendezvousHandler):
    """The stock c10d handler whose workers' store is made and published every round."""

    def get_backend(self) -> str:
        return BACKEND  # torchrun's registry checks the handler answers to its own name

    def next_rendezvous(self) -> Any:
        # Each round starts from nothing cached: its rank 0 makes a store (the workers of
        # the last round are gone with their store) and publishes its address under the
        # round's keys, where every agent of the round, new or old, reads it.
        for name in _CACHED:
            setattr(self, name, None)
        return super().next_rendezvous()


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The handler torchrun asks for with ``--rdzv-backend ckptstore-c10d``."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

    backend, store = create_backend(params)
    handler = dynamic_rendezvous.create_handler(store, backend, params)
    missing = [name for name in _CACHED if not hasattr(handler, name)]
    if type(handler) is not DynamicRendezvousHandler or missing:
        raise RendezvousVersionError(
            f"the rendezvous backend {BACKEND!r} does not know torch {torch.__version__}'s "
            f"rendezvous handler ({type(handler).__name__}"
            + (f", without {', '.join(missing)}" if missing else "")
            + "); use torchrun's stock --rdzv-backend c10d meanwhile (a replaced or added node "
            "cannot join a running job under it: docs/multinode.md), and report it to ckptstore"
        )
    # The stock factory parses every option (timeouts, keep-alive, local address) and
    # builds a DynamicRendezvousHandler; this one differs in two methods and no state, so
    # it takes the object over instead of repeating that parsing here.
    handler.__class__ = _PerRoundStoreHandler
    return handler


def handler_creator() -> Any:
    """The ``torchrun.handlers`` entry point: torchrun calls it for the creator function."""
    return create_handler
