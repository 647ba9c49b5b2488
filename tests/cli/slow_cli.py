"""``ckptstore-tool`` with slowed store calls, so a test can interrupt a copy mid-way.

    python tests/cli/slow_cli.py put_part=1.0,put=0.2 cp SRC DST ...

Wraps every store the tool opens in a ``FaultyStore`` that sleeps that many seconds in each
named method, then runs the real ``main``. Test-only: the tool itself has no such hook.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ckptstore.cli import context  # noqa: E402 - after the checkout is on sys.path
from ckptstore.cli.main import main  # noqa: E402
from ckptstore.testing.faults import Fault, FaultyStore  # noqa: E402


def slowed(spec: str):
    delays = {m.strip(): float(s) for m, _, s in (i.partition("=") for i in spec.split(","))}
    real = context.open_store

    def open_store(url, options=None):
        return FaultyStore(real(url, options), [Fault(m, delay=s) for m, s in delays.items()])

    return open_store


if __name__ == "__main__":
    context.open_store = slowed(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
