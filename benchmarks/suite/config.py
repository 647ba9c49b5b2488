"""The suite's scenarios, declaratively: ``python -m benchmarks.suite --config NAME``.

A config is a name and a list of scenarios; each scenario is a ``kind`` plus that kind's
options (see ``scenarios.py`` for what each kind runs). A JSON file of the same shape
works too: ``--config my.json``.

kinds:
  floor     physical floors on the local volume: one process writes the state's bytes
            sequentially from a ready buffer + fsync, then reads them back into a buffer
  local     checkpoint.local.run: rank-0 torch.save, stock DCP, ckptstore; save + same-world load
  reshard   save on ``world`` ranks (stock DCP, ckptstore), load on each of ``load_worlds``
  async     checkpoint.async_save.run: copy_ floor, torch.save, dcp.async_save (+DefaultStager),
            CheckpointManager (+local_tier_dir, background="process"): blocking and
            until-committed times (its loop-interference figures stay in its own output)
  objstore  objstore.save_load.run: SeaweedFS started here; raw PUT/GET ceiling, FsspecWriter,
            ckptstore, s3torchconnector; ``links`` direct and/or shaped
  objstore_torchsave   rank-0 torch.save + upload vs ckptstore vs FsspecWriter on one
            SeaweedFS (objstore/torchsave_s3.py)
  data      data.loader.main with ``args``: fsspec DataLoader vs ckptstore cold/warm cache
"""

from __future__ import annotations

__all__ = ["CONFIGS"]

_OBJ = ["raw", "fsspec", "ckptstore", "s3torch"]

QUICK = {
    "name": "quick",
    "scenarios": [
        {"kind": "floor", "size_mib": 256, "repeats": 3},
        {"kind": "local", "size_mib": 256, "world": 2, "repeats": 2},
        {"kind": "reshard", "size_mib": 256, "world": 2, "load_worlds": [1], "repeats": 2},
        {"kind": "async", "size_mib": 256, "world": 2, "saves": 3},
        {
            "kind": "objstore",
            "size_mib": 128,
            "world": 2,
            "repeats": 2,
            "links": ["direct"],
            "contenders": _OBJ,
        },
        {"kind": "objstore_torchsave", "size_mib": 64, "world": 2, "repeats": 2},
        {"kind": "data", "args": ["--quick", "--step-ms", "50"]},
    ],
}

# What fits in ~15 minutes on the shared 2-core machine: 1 GiB, world 1/2/4, both links,
# fewer repeats where a scenario is slow.
MEDIUM = {
    "name": "medium",
    "scenarios": [
        {"kind": "floor", "size_mib": 1024, "repeats": 3},
        {"kind": "local", "size_mib": 1024, "world": 2, "repeats": 3},
        {"kind": "local", "size_mib": 1024, "world": 1, "repeats": 3},
        {"kind": "local", "size_mib": 1024, "world": 4, "repeats": 2},
        {"kind": "reshard", "size_mib": 1024, "world": 2, "load_worlds": [1, 4], "repeats": 2},
        {"kind": "async", "size_mib": 1024, "world": 2, "saves": 3},
        {  # 512 MiB: SeaweedFS shares the 2 cores; 1 GiB on both links takes > 10 min
            "kind": "objstore",
            "size_mib": 512,
            "world": 2,
            "repeats": 2,
            "links": ["direct", "shaped"],
            "contenders": _OBJ,
        },
        {"kind": "objstore_torchsave", "size_mib": 512, "world": 2, "repeats": 2},
        {"kind": "data", "args": ["--repeat", "1"]},
    ],
}

# The full matrix: adds 4 GiB (memory allows it here: 24 GiB) and 4-rank async.
FULL = {
    "name": "full",
    "scenarios": MEDIUM["scenarios"]
    + [
        {
            "kind": "objstore",
            "size_mib": 1024,
            "world": 2,
            "repeats": 3,
            "links": ["direct", "shaped"],
            "contenders": _OBJ,
        },
        {"kind": "floor", "size_mib": 4096, "repeats": 3},
        {"kind": "local", "size_mib": 4096, "world": 2, "repeats": 3},
        {"kind": "async", "size_mib": 1024, "world": 4, "saves": 4},
        {"kind": "data", "args": ["--repeat", "3", "--stream-mibps", "4"]},
    ],
}

CONFIGS = {c["name"]: c for c in (QUICK, MEDIUM, FULL)}
