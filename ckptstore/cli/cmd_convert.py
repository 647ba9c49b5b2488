"""``ckptstore-tool convert SRC DST --to dcp|torch|safetensors [--compress CODEC]``.

* DCP -> DCP streams item by item (``ckptstore.format.transcode``): the rank layout is kept,
  a codec (``ckptstore.format.codec_names``: zstd, or one registered) is added, changed
  or removed, and a stock DCP checkpoint is adopted (gets a manifest and a
  marker). Memory stays bounded.
* Everything else loads the whole state dict in memory (the single-file formats need it):
  DCP is read with ckptstore's verifying reader and torch's ``_EmptyStateDictLoadPlanner``
  (what ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` does), files are read
  through the store, and DCP is written with ``ckptstore.save`` (manifest + create-only marker).

Every output is verified: a DCP output is re-read against its manifest, a single file is read
back and its CRC32C compared with what was written. An incomplete source is refused; an
existing destination is refused unless ``--force``.
"""

from __future__ import annotations

import argparse
import io
import os
import threading
import time
import warnings
from typing import Any

from ckptstore import Store, verify_checkpoint
from ckptstore.cli.context import Context
from ckptstore.cli.render import Progress, dump_json, human_bytes, note
from ckptstore.cli.sources import (
    Located,
    classify,
    flatten,
    load_state,
    local_path,
    locate,
    require_committed,
)
from ckptstore.errors import (
    CheckpointExistsError,
    ConfigError,
    CorruptCheckpointError,
    missing_dependency,
)
from ckptstore.format import check_empty_destination, codec_names, crc32c, uncommit

__all__ = ["add_parser", "run", "save_file"]

TARGETS = ("dcp", "torch", "safetensors")


def add_parser(sub: Any, common: Any) -> None:
    """Register the ``convert`` subcommand on ``sub``; ``common`` adds the shared options."""
    p = sub.add_parser(
        "convert",
        help="DCP <-> torch.save <-> safetensors, optionally compressing DCP shards",
        description="Convert a checkpoint between DCP (a folder), a single torch.save file and "
        "a Hugging Face safetensors file, on any URL. DCP -> DCP re-encodes the shards (add or "
        "remove a codec such as zstd; adopt a stock DCP checkpoint). The output is verified.",
    )
    p.add_argument("src", metavar="SRC", help="committed DCP checkpoint, .pt or .safetensors")
    p.add_argument("dst", metavar="DST", help="destination (a folder for dcp, else a file)")
    p.add_argument("--to", required=True, choices=TARGETS, help="output format")
    p.add_argument(
        "--compress",
        choices=codec_names(),
        default="none",
        help="codec of the DCP shards written (only with --to dcp)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing destination")
    p.add_argument(
        "--allow-pickle",
        action="store_true",
        help="let torch.load run arbitrary pickled objects: a torch.save source, or the "
        "non-tensor entries of a DCP source read for --to torch / safetensors (trusted "
        "checkpoints only; default: torch.load(weights_only=True))",
    )
    p.add_argument(
        "--drop-objects",
        action="store_true",
        help="with --to safetensors: leave out non-tensor entries instead of refusing",
    )
    p.add_argument(
        "--no-verify", action="store_true", help="skip re-reading the output after writing it"
    )
    common(p, two_sided=True)
    p.set_defaults(func=run)


def _tensors_for_safetensors(flat: dict[str, Any], drop_objects: bool) -> dict[str, Any]:
    import torch

    objects = sorted(k for k, v in flat.items() if not isinstance(v, torch.Tensor))
    if objects and not drop_objects:
        shown = ", ".join(objects[:5]) + (", ..." if len(objects) > 5 else "")
        raise ConfigError(
            f"safetensors holds tensors only; {len(objects)} entries are not tensors ({shown}). "
            "Pass --drop-objects to leave them out, or convert --to torch."
        )
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for k, v in flat.items():
        if not isinstance(v, torch.Tensor):
            continue
        t = v.detach().cpu()
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if not t.is_contiguous() or (ptr is not None and ptr in seen):
            t = t.contiguous().clone()  # safetensors refuses shared or strided storage
        if ptr is not None:
            seen.add(t.untyped_storage().data_ptr())
        out[k] = t
    return out


def save_file(
    ctx: Context,
    store: Store,
    name: str,
    fmt: str,
    state: dict[str, Any],
    *,
    drop_objects: bool = False,
    verify: bool = True,
) -> int:
    """Write ``state`` as one torch.save or safetensors file; returns its size."""
    if fmt == "safetensors":
        try:
            from safetensors.torch import save as st_save
        except ImportError as exc:
            raise missing_dependency("safetensors", "cli") from exc
        data: bytes | memoryview = st_save(
            _tensors_for_safetensors(flatten(state), drop_objects), metadata={"format": "pt"}
        )
    else:
        import torch

        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getbuffer()
    info = ctx.engine.put(store, name, data)
    if verify:
        back = ctx.engine.read(store, name)
        if len(back) != info.size or crc32c(back) != info.crc32c:
            raise CorruptCheckpointError(
                f"{store.describe(name)} does not read back as written (size or CRC32C differs); "
                "the destination store lost or changed bytes."
            )
    return info.size


def _tensor_names(ctx: Context, src: Located) -> list[str]:
    from ckptstore.cli.sources import dcp_entries, dcp_reader

    metadata = dcp_reader(ctx, src.store, note_stock=False).read_metadata()
    return [n for n, e in dcp_entries(metadata).items() if e.kind == "tensor"]


def _check_destination(ctx: Context, dst_url: str, fmt: str, force: bool) -> tuple[Store, str]:
    path = local_path(dst_url)
    if fmt == "dcp":
        if path is not None and os.path.isfile(path):
            raise ConfigError(
                f"{dst_url} is a file; --to dcp writes a folder (a DCP checkpoint): pick a "
                "folder that is empty or does not exist yet"
            )
        dst = ctx.open(dst_url, "dst")
        check_empty_destination(dst, force)
        return dst, ""
    if path is not None and os.path.isdir(path):
        raise ConfigError(
            f"{dst_url} is a folder; --to {fmt} writes a single file: give the file's path "
            f"(e.g. {dst_url.rstrip('/')}/model.{'pt' if fmt == 'torch' else fmt})"
        )
    parent, name = ctx.open_file(dst_url, "dst")
    if parent.exists(name) and not force:
        raise CheckpointExistsError(
            f"{dst_url} already exists; pick another destination or pass --force to replace it."
        )
    if not parent.exists(name) and classify(ctx.open(dst_url, "dst")) != "missing":
        raise ConfigError(f"{dst_url} is a folder; --to {fmt} writes a single file")
    return parent, name


def _convert(ctx: Context, args: argparse.Namespace, src: Located, bar: Progress) -> dict:
    dst_store, dst_name = _check_destination(ctx, args.dst, args.to, args.force)
    if args.to == "dcp" and src.format == "dcp":
        from ckptstore.format import StockCheckpointWarning, transcode

        if args.force:
            uncommit(dst_store)
        cancel = threading.Event()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", StockCheckpointWarning)  # noted in run()
                transcode(
                    src.store,
                    dst_store,
                    ctx.engine,
                    codec=args.compress,
                    on_bytes=bar.update,
                    cancel=cancel,
                )
        except BaseException:
            cancel.set()
            raise
        return {"dst_store": dst_store}
    bar.set_description("read")
    keys = None
    if args.to == "safetensors" and args.drop_objects and src.format == "dcp":
        keys = _tensor_names(ctx, src)  # objects left out are never read, let alone unpickled
    state = load_state(ctx, src, keys=keys, allow_pickle=args.allow_pickle)
    bar.set_description("write")
    if args.to == "dcp":
        import ckptstore

        writer = ckptstore.writer(dst_store, overwrite=args.force, codec=args.compress)
        writer.engine = ctx.engine
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DCP's "no process group: no_dist" chatter
            ckptstore.save(state, writer)
        return {"dst_store": dst_store}
    size = save_file(
        ctx,
        dst_store,
        dst_name,
        args.to,
        state,
        drop_objects=args.drop_objects,
        verify=not args.no_verify,
    )
    return {"size": size}


def run(args: argparse.Namespace, ctx: Context) -> int:
    """Convert ``args.src`` to ``args.dst`` and verify the output (unless ``--no-verify``).

    Prints a summary (or JSON with ``--json``) and returns 0. Raises ``ConfigError`` for
    ``--compress`` without ``--to dcp``, an uncommitted source, or a destination of the
    wrong kind; ``CheckpointExistsError`` for an existing destination without ``--force``;
    ``CorruptCheckpointError`` if the output does not read back as written.
    """
    if args.compress != "none" and args.to != "dcp":
        raise ConfigError("--compress applies to DCP shards only; use it with --to dcp")
    src = locate(ctx, args.src, "src")
    if src.format == "dcp":
        if classify(src.store) == "stock":
            if not ctx.quiet and args.to == "dcp":  # (load_state notes it for the others)
                note(f"note: {args.src} is a stock DCP checkpoint: no manifest, nothing verified")
        else:
            require_committed(src.store, args.src, "convert")
    started = time.monotonic()
    total = None
    if src.format == "dcp" and args.to == "dcp":
        from ckptstore.cli.describe import describe

        total = describe(ctx, args.src)["totals"]["stored_bytes"]
    with Progress(total, "convert", ctx.progress_enabled) as bar:
        out = _convert(ctx, args, src, bar)
        verified = not args.no_verify
        if "dst_store" in out and verified:
            bar.set_description("verify")
            report = verify_checkpoint(out["dst_store"], ctx.engine)
            if not report.ok:
                names = ", ".join(f.name for f in report.bad_files)
                raise CorruptCheckpointError(
                    f"{args.dst} does not verify after writing ({names}); the destination "
                    "store lost or changed bytes."
                )
            out["size"] = report.bytes_read
    seconds = time.monotonic() - started
    result = {
        "src": args.src,
        "src_format": src.format,
        "dst": args.dst,
        "dst_format": args.to,
        "codec": args.compress if args.to == "dcp" else None,
        "bytes": out.get("size"),
        "verified": verified,
        "seconds": round(seconds, 3),
    }
    if ctx.json:
        dump_json(result)
    else:
        fmt = (
            f"{args.to}, {args.compress}"
            if args.to == "dcp" and args.compress != "none"
            else args.to
        )
        done = "written and verified" if verified else "written (not verified: --no-verify)"
        print(
            f"converted {args.src} ({src.format}) -> {args.dst} ({fmt}): "
            f"{human_bytes(out.get('size'))} {done} in {seconds:.2f} s."
        )
    return 0
