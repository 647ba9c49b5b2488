"""``python -m ckptstore.cli`` runs ``ckptstore-tool``."""

from __future__ import annotations

import sys

from ckptstore.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
