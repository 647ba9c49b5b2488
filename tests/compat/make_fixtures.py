"""Writes the compatibility matrix's checkpoints under the running torch release.

    .venv-torch-2.15.0/bin/python tests/compat/make_fixtures.py   # in each tested venv

makes ``tests/compat/fixtures/torch-<release>/`` (replacing it) with one checkpoint of
:func:`expected_state` per writer: ``writer`` (``ckptstore.save``), ``manager`` (a
``CheckpointManager`` root holding step 1) and ``stock`` (stock ``dcp.save``, no
ckptstore file). ``test_matrix.py`` reads every release's under every release. A new
tested torch release adds its folder by running this there; the folders are committed.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
WRITERS = ("writer", "manager", "stock")


def release(version: str = torch.__version__) -> str:
    """``2.15.0`` of ``2.15.0+cu130``."""
    return version.split("+")[0]


def expected_state() -> dict:
    """What every fixture holds: contiguous tensors of three dtypes and a plain int (an
    object item), the same bytes on every release."""
    return {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7,
        "e": torch.arange(10, dtype=torch.bfloat16).reshape(2, 5),
        "i": torch.arange(6, dtype=torch.int64),
        "n": 7,
    }


def empty_state() -> dict:
    """A state of :func:`expected_state`'s shapes, to load into."""
    return {
        k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0
        for k, v in expected_state().items()
    }


def main() -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    import torch.distributed.checkpoint as dcp

    import ckptstore
    from ckptstore.manager import CheckpointManager

    out = os.path.join(FIXTURES, f"torch-{release()}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    ckptstore.save(expected_state(), os.path.join(out, "writer"))
    with CheckpointManager(os.path.join(out, "manager"), async_save=False) as mgr:
        mgr.save(1, expected_state())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ..."
        dcp.save(expected_state(), checkpoint_id=os.path.join(out, "stock"), no_dist=True)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
