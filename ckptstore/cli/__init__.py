"""``ckptstore-tool``: inspect, verify, convert, copy and prune checkpoints; plan goodput.

The entry point is ``ckptstore.cli.main:main`` (also ``python -m ckptstore.cli``); one module
per subcommand, ``cmd_<command>`` (``cmd_cp`` for ``cp``), ``exit_codes`` for what a failure
prints and exits with, ``render`` for tables / JSON / progress, ``context`` for storage
options and URL handling, ``sources`` for reading any checkpoint format. It imports only the
public API: ``ckptstore``, ``ckptstore.format`` (the on-storage format) and the packages
ARCHITECTURE.md names. See ``docs/cli.md``.
"""

from __future__ import annotations

__all__: list[str] = []
