"""A generated Parquet token dataset for the resilience example, and how a sample is batched.

    python examples/resilience/tokens.py OUT_DIR --samples 240 --shards 6

Every row is one sample: ``id`` (its index in the concatenation of the shards, the id the
data order uses) and ``tokens`` (``seq_len + 1 + CROP`` token ids drawn from a fixed random
bigram chain, so a small model can learn something). The augmentation :func:`crop` picks a
window of ``seq_len + 1`` tokens from the seed the data layer hands it, a pure function of
(seed, epoch, sample id), so a sample is cropped the same way after any resume or resize.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

__all__ = ["CROP", "write_dataset", "crop", "collate"]

CROP = 8  # extra tokens per row: the augmentation picks an offset in [0, CROP]


def _chain(vocab: int, rng: np.random.Generator) -> np.ndarray:
    """A sparse random bigram transition matrix: each token has 4 likely successors."""
    probs = np.full((vocab, vocab), 0.02 / vocab)
    for t in range(vocab):
        nxt = rng.choice(vocab, size=4, replace=False)
        probs[t, nxt] += rng.dirichlet(np.ones(4)) * 0.98
    return probs / probs.sum(axis=1, keepdims=True)


def write_dataset(
    out: str,
    samples: int = 240,
    shards: int = 6,
    seq_len: int = 32,
    vocab: int = 64,
    seed: int = 0,
    row_group: int = 10,
) -> list[str]:
    """Write ``samples`` rows as ``shards`` Parquet files under ``out``; their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    probs = _chain(vocab, rng)
    cdf = probs.cumsum(axis=1)
    width = seq_len + 1 + CROP
    tokens = np.empty((samples, width), dtype=np.int64)
    tokens[:, 0] = rng.integers(0, vocab, size=samples)
    for j in range(1, width):
        u = rng.random(samples)[:, None]
        tokens[:, j] = (u > cdf[tokens[:, j - 1]]).sum(axis=1).clip(max=vocab - 1)
    os.makedirs(out, exist_ok=True)
    bounds = [i * samples // shards for i in range(shards + 1)]
    paths = []
    for i in range(shards):
        lo, hi = bounds[i], bounds[i + 1]
        table = pa.table(
            {
                "id": np.arange(lo, hi, dtype=np.int64),
                "tokens": pa.array(list(tokens[lo:hi].astype(np.uint8)), pa.list_(pa.uint8())),
            }
        )
        path = os.path.join(out, f"tokens-{i:04d}.parquet")
        pq.write_table(table, path, row_group_size=row_group)
        paths.append(path)
    return paths


def crop(sample: dict[str, Any], seed: int) -> dict[str, Any]:
    """The augmentation: a window of the row chosen by ``seed`` (the data layer's sample seed)."""
    tokens = sample["tokens"]
    offset = int(np.random.default_rng(seed).integers(0, CROP + 1))
    return {"id": sample["id"], "tokens": tokens[offset : len(tokens) - CROP + offset]}


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"id": (B,), "tokens": (B, seq_len + 1)}`` as int64 tensors."""
    import torch

    return {
        "id": torch.tensor([s["id"] for s in samples], dtype=torch.int64),
        "tokens": torch.tensor([list(s["tokens"]) for s in samples], dtype=torch.int64),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--samples", type=int, default=240)
    p.add_argument("--shards", type=int, default=6)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    paths = write_dataset(a.out, a.samples, a.shards, a.seq_len, a.vocab, a.seed)
    print(f"wrote {a.samples} samples in {len(paths)} shards under {a.out}")


if __name__ == "__main__":
    main()
