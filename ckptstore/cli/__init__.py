"""``ckptstore-tool``: inspect, verify, convert, copy and prune checkpoints; plan goodput.

The entry point is ``ckptstore.cli.main:main`` (also ``python -m ckptstore.cli``); one module
per subcommand, ``render`` for tables / JSON / progress, ``context`` for storage options and
URL handling, ``sources`` for reading any checkpoint format. See ``docs/cli.md``.
"""

from __future__ import annotations

__all__: list[str] = []
