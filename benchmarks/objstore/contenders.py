"""The contenders of ``objstore.save_load``: what each one's save and load do on one rank.

Each ``SAVE_FNS[name](ctx, link, key)`` writes this rank's state to ``s3://bench/<link>/<key>``
on the link's endpoint; ``LOAD_FNS[name]`` reads it back into ``ctx.dest``. See
``save_load.py`` for what each contender is and how it is timed.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import MiB, StateShape

__all__ = [
    "BenchConfig",
    "RankCtx",
    "LOAD_FNS",
    "SAVE_FNS",
    "CONTENDERS",
    "LINKS",
    "BUCKET",
    "labels",
    "raw_bodies",
    "delete_prefix",
    "cpu_seconds",
    "import_s3torch",
]

BUCKET = "bench"
REGION = "us-east-1"
#: s3fs client options for SeaweedFS (stock fsspec and the raw ceiling): checksums only when
#: required.
CLIENT_CONFIG = {
    "request_checksum_calculation": "when_required",
    "response_checksum_validation": "when_required",
}
CONTENDERS = ("raw", "fsspec", "fsspec-nosync", "ckptstore", "tuned", "s3torch")
LINKS = ("direct", "shaped")


@dataclass(frozen=True)
class BenchConfig(StateShape):
    part_mib: int = 0  # tuned ckptstore row; 0 = ckptstore's default
    concurrency: int = 0  # tuned ckptstore row; 0 = ckptstore's default
    link_mbps: float = 200.0
    link_latency_ms: float = 20.0
    links: tuple[str, ...] = LINKS
    contenders: tuple[str, ...] = CONTENDERS
    warmup: bool = True
    ops: tuple[str, ...] = ("save", "load")  # without "load": saves only

    def transfer_config(self, tuned: bool) -> Any:
        from ckptstore.config import TransferConfig

        default = TransferConfig()
        if not tuned:
            return default
        part = self.part_mib * MiB if self.part_mib else default.part_size
        conc = self.concurrency or default.concurrency
        return TransferConfig(
            part_size=part, concurrency=conc, memory_budget=max(default.memory_budget, part * conc)
        )


@dataclass
class Labels:
    save: str
    load: str | None


def labels(cfg: BenchConfig) -> dict[str, Labels]:
    t = cfg.transfer_config(True)
    tuned = f"ckptstore {t.part_size // MiB} MiB x {t.concurrency} (tuned)"
    return {
        "raw": Labels("raw PUT ceiling", "raw GET ceiling"),
        "fsspec": Labels("FsspecWriter", "FsspecReader"),
        "fsspec-nosync": Labels("FsspecWriter sync_files=False", None),
        "ckptstore": Labels("ckptstore", "ckptstore (verified)"),
        "tuned": Labels(tuned, f"{tuned} (verified)"),
        "s3torch": Labels("s3torchconnector", "s3torchconnector"),
    }


# -- per-rank side -----------------------------------------------------------------------
@dataclass
class RankCtx:
    rank: int
    world: int
    cfg: BenchConfig
    endpoints: dict[str, str]
    pids: dict[str, int]
    vacuum_url: str
    link_counters: Any = None  # shared (bytes up, bytes down) of the shaped link
    state: dict[str, Any] = field(default_factory=dict)
    dest: dict[str, Any] = field(default_factory=dict)
    bodies: list[bytearray] = field(default_factory=list)
    raw_dest: dict[int, Any] = field(default_factory=dict)  # size -> the raw GET's buffer
    clients: dict[str, Any] = field(default_factory=dict)

    def options(self, link: str, stock: bool) -> dict[str, Any]:
        opts: dict[str, Any] = {
            "key": "testing",
            "secret": "testing",
            "endpoint_url": self.endpoints[link],
        }
        if stock:
            opts["config_kwargs"] = dict(CLIENT_CONFIG)
        return opts

    def url(self, link: str, key: str) -> str:
        return f"s3://{BUCKET}/{link}/{key}"


def raw_bodies(state: dict[str, Any], part_size: int) -> list[bytearray]:
    """The rank's tensor bytes, concatenated and cut into part-sized ``bytearray``s (untimed).

    ``save_raw`` sends each as S3Store sends a part (``s3.body.buffers_body``): aiohttp's own
    payload for a bytearray would copy it twice more (a slice, and a join with the request
    head), a ``bytes`` body once more (botocore wraps it in a ``BytesIO``).
    """
    import torch

    flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in state.values()])
    view = memoryview(flat.numpy()).cast("B")
    return [bytearray(view[i : i + part_size]) for i in range(0, len(view), part_size)]


def _raw_client(ctx: RankCtx, link: str) -> Any:
    """s3fs's aiobotocore client for ``link`` (its own instance, kept for the run)."""
    key = f"raw-{link}"
    if key not in ctx.clients:
        import s3fs
        from fsspec.asyn import sync

        fs = s3fs.S3FileSystem(
            key="testing",
            secret="testing",
            endpoint_url=ctx.endpoints[link],
            # Unsigned payloads, as ckptstore sends them (with a CRC32C): the ceiling pays
            # no SHA-256 of the bodies.
            config_kwargs={
                **CLIENT_CONFIG,
                "max_pool_connections": 64,
                "s3": {"payload_signing_enabled": False},
            },
            skip_instance_cache=True,
        )
        ctx.clients[key] = (fs, sync(fs.loop, fs.set_session))
    return ctx.clients[key]


def save_raw(ctx: RankCtx, link: str, key: str) -> None:
    from fsspec.asyn import sync

    from ckptstore.stores.s3.body import buffers_body, no_expect_for_buffers

    fs, client = _raw_client(ctx, link)
    no_expect_for_buffers(client)
    conc = ctx.cfg.transfer_config(False).concurrency
    obj = f"{link}/{key}/rank{ctx.rank}.bin"

    async def go() -> None:
        up = await client.create_multipart_upload(Bucket=BUCKET, Key=obj)
        sem = asyncio.Semaphore(conc)

        async def part(i: int, body: bytearray) -> dict[str, Any]:
            async with sem:
                # Sent as S3Store sends its parts (no slice, no join with the request head).
                out = await client.upload_part(
                    Bucket=BUCKET,
                    Key=obj,
                    UploadId=up["UploadId"],
                    PartNumber=i + 1,
                    Body=buffers_body([body]),
                )
            return {"PartNumber": i + 1, "ETag": out["ETag"]}

        parts = await asyncio.gather(*(part(i, b) for i, b in enumerate(ctx.bodies)))
        await client.complete_multipart_upload(
            Bucket=BUCKET, Key=obj, UploadId=up["UploadId"], MultipartUpload={"Parts": parts}
        )

    sync(fs.loop, go)


def load_raw(ctx: RankCtx, link: str, key: str) -> None:
    from fsspec.asyn import sync

    from ckptstore.engine.readplan import READ_RANGE, range_size, read_streams

    fs, client = _raw_client(ctx, link)
    tc = ctx.cfg.transfer_config(False)
    obj = f"{link}/{key}/rank{ctx.rank}.bin"
    total = sum(len(b) for b in ctx.bodies)
    # ckptstore's read plan (engine.readplan): as many GETs in flight, of the same size.
    streams = read_streams(tc.part_size, tc.concurrency)
    get_size = range_size(total, min(tc.part_size, READ_RANGE), streams)

    if total not in ctx.raw_dest:  # made and paged in once, untimed (as the load targets are)
        ctx.raw_dest[total] = memoryview(bytearray(total))
    dest = ctx.raw_dest[total]

    async def go() -> int:
        sem = asyncio.Semaphore(streams)

        async def get(start: int) -> int:
            end = min(start + get_size, total) - 1
            async with sem:
                out = await client.get_object(Bucket=BUCKET, Key=obj, Range=f"bytes={start}-{end}")
                body = out["Body"]
                try:  # each received chunk copied once into place, as S3Store.get_into does
                    n = start
                    while chunk := await body.raw_stream.content.readany():
                        dest[n : n + len(chunk)] = chunk
                        n += len(chunk)
                    return n - start
                finally:
                    body.close()

        return sum(await asyncio.gather(*(get(s) for s in range(0, total, get_size))))

    got = sync(fs.loop, go)
    if got != total:
        raise AssertionError(f"rank {ctx.rank}: raw GET read {got} of {total} bytes")


def save_fsspec(ctx: RankCtx, link: str, key: str, sync_files: bool = True) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    w = FsspecWriter(ctx.url(link, key), sync_files=sync_files, **ctx.options(link, stock=True))
    dcp.save(ctx.state, storage_writer=w)


def load_fsspec(ctx: RankCtx, link: str, key: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    r = FsspecReader(ctx.url(link, key), **ctx.options(link, stock=True))
    dcp.load(ctx.dest, storage_reader=r)


def save_ckptstore(ctx: RankCtx, link: str, key: str, tuned: bool = False) -> None:
    import ckptstore
    from ckptstore import WriterOptions

    config = ctx.cfg.transfer_config(tuned)
    opts = ctx.options(link, stock=False)
    ckptstore.save(
        ctx.state,
        ckptstore.writer(ctx.url(link, key), WriterOptions(transfer=config), storage_options=opts),
    )


def load_ckptstore(ctx: RankCtx, link: str, key: str, tuned: bool = False) -> None:
    import ckptstore

    config = ctx.cfg.transfer_config(tuned)
    opts = ctx.options(link, stock=False)
    ckptstore.load(
        ctx.dest, ckptstore.reader(ctx.url(link, key), storage_options=opts, transfer=config)
    )


def import_s3torch() -> tuple[Any, bool]:
    """``s3torchconnector.dcp`` and whether a stand-in for ``tenacity`` had to be used."""
    shim = False
    try:
        import tenacity  # noqa: F401
    except ImportError:
        import types

        mod = types.ModuleType("tenacity")
        mod.retry = lambda **_: lambda fn: fn  # type: ignore[attr-defined]
        for name in (
            "stop_after_attempt",
            "retry_if_exception_type",
            "before_sleep_log",
            "after_log",
            "wait_random_exponential",
        ):
            setattr(mod, name, lambda *a, **k: None)
        sys.modules["tenacity"] = mod
        shim = True
    import s3torchconnector.dcp as s3dcp

    return s3dcp, shim


def _s3torch_client(ctx: RankCtx, link: str) -> Any:
    key = f"s3torch-{link}"
    if key not in ctx.clients:
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client

        config = S3ClientConfig(force_path_style=True)
        ctx.clients[key] = S3Client(REGION, endpoint=ctx.endpoints[link], s3client_config=config)
    return ctx.clients[key]


def save_s3torch(ctx: RankCtx, link: str, key: str) -> None:
    import torch.distributed.checkpoint as dcp

    s3dcp, _ = import_s3torch()
    w = s3dcp.S3StorageWriter(REGION, ctx.url(link, key))
    w.fs = s3dcp.S3FileSystem(REGION, s3_client=_s3torch_client(ctx, link))
    dcp.save(ctx.state, storage_writer=w)


def load_s3torch(ctx: RankCtx, link: str, key: str) -> None:
    import torch.distributed.checkpoint as dcp

    s3dcp, _ = import_s3torch()
    r = s3dcp.S3StorageReader(REGION, ctx.url(link, key))
    r.fs = s3dcp.S3FileSystem(
        REGION,
        s3_client=_s3torch_client(ctx, link),
        reader_constructor=r._reader_constructor,
    )
    dcp.load(ctx.dest, storage_reader=r)


SAVE_FNS: dict[str, Callable[[RankCtx, str, str], None]] = {
    "raw": save_raw,
    "fsspec": save_fsspec,
    "fsspec-nosync": lambda c, link, k: save_fsspec(c, link, k, sync_files=False),
    "ckptstore": save_ckptstore,
    "tuned": lambda c, link, k: save_ckptstore(c, link, k, tuned=True),
    "s3torch": save_s3torch,
}
LOAD_FNS: dict[str, Callable[[RankCtx, str, str], None]] = {
    "raw": load_raw,
    "fsspec": load_fsspec,
    "ckptstore": load_ckptstore,
    "tuned": lambda c, link, k: load_ckptstore(c, link, k, tuned=True),
    "s3torch": load_s3torch,
}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def delete_prefix(ctx: RankCtx, link: str, key: str) -> None:
    fs, _ = _raw_client(ctx, "direct")
    path = f"{BUCKET}/{link}/{key}"
    if fs.exists(path):
        fs.rm(path, recursive=True)
    fs.invalidate_cache()
