"""The project's test harness (``tools/ckptstore-harness``, the dev-only ``ckptstore-harness``
distribution that ``tools/setup.sh`` installs editable; never in the ckptstore wheel):
object-store server launchers (``seaweedfs``, ``azurite``, ``fakegcs``, ``motoserver``,
``servers``, ``objstore``), a fault-injecting TCP proxy (``proxy``), multi-process runs
(``dist``), chaos runs under torchrun (``chaos``, ``nodes``) and the checks made from them
(``runlog``, ``nodelog``, ``ckptcheck``, ``goodput_report``). The tests, benchmarks and
``make demo`` import it."""

from __future__ import annotations

import os

__all__ = ["checkout_root"]


def checkout_root() -> str:
    """The folder holding the ``ckptstore`` package this process imported (the checkout).

    Child processes get it first on PYTHONPATH, so they run the same ckptstore as the parent.
    """
    import ckptstore

    return os.path.dirname(os.path.dirname(os.path.abspath(ckptstore.__file__)))
