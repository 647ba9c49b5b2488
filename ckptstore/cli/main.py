"""``ckptstore-tool``: argument parsing, dispatch, and the error -> exit code mapping.

Exit codes (the same for every subcommand):

====  ===========================================================================
0     success
1     a check failed: ``verify`` / ``ls`` found damage, ``diff`` found differences,
      or a copy / conversion stopped on bytes that do not match the manifest
2     usage or access error: bad arguments, nothing at the URL, not a checkpoint,
      an incomplete checkpoint where a committed one is needed, an existing
      destination without ``--force``, credentials refused, missing extra
3     internal error (a bug: the traceback is printed; please report it)
130   interrupted (Ctrl-C); ``cp`` / ``convert`` leave nothing committed
====  ===========================================================================

Every ``CkptStoreError`` is printed as one line on stderr, without a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
import warnings
from collections.abc import Sequence

from ckptstore.cli import convert, copy, diff, gc, goodput, inspect, ls, verify
from ckptstore.cli.context import Context, add_common_arguments
from ckptstore.errors import CkptStoreError, CorruptCheckpointError

__all__ = [
    "main",
    "build_parser",
    "EXIT_OK",
    "EXIT_CHECK_FAILED",
    "EXIT_USAGE",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
]

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130

_EPILOG = """\
exit codes: 0 ok; 1 check failed (damage found, checkpoints differ); 2 usage or access error
(bad arguments, nothing at the URL, not a checkpoint, incomplete checkpoint, destination
exists); 3 internal error; 130 interrupted.

URLs: a path or file://, s3://, gs://, az:// / abfs://. Credentials and endpoints go in
-o/--storage-option KEY=VALUE (after the subcommand), e.g.
  ckptstore-tool ls s3://bucket/run1 -o client_kwargs.endpoint_url=http://127.0.0.1:8333
"""

COMMANDS = (ls, inspect, verify, convert, copy, gc, diff, goodput)


def build_parser() -> argparse.ArgumentParser:
    from ckptstore import __version__

    parser = argparse.ArgumentParser(
        prog="ckptstore-tool",
        description="Inspect, verify, convert, copy and prune PyTorch DCP checkpoints on any "
        "store; plan checkpoint intervals.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ckptstore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub, add_common_arguments)  # type: ignore[attr-defined]
    return parser


def _error(message: str) -> None:
    print(f"ckptstore-tool: error: {message}", file=sys.stderr)


def _quiet_library_chatter() -> None:
    # DCP warns that it runs without a process group; the CLI always does, on purpose.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*torch.distributed.*disabled.*")
    warnings.filterwarnings("ignore", message=".*process group.*")
    warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
    logging.basicConfig(level=logging.WARNING, format="ckptstore-tool: %(message)s")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``ckptstore-tool`` command; returns the exit code (never raises SystemExit)."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # --help, --version, or a usage error argparse printed
        return int(exc.code or 0) if isinstance(exc.code, int) else EXIT_USAGE
    _quiet_library_chatter()
    ctx: Context | None = None
    try:
        ctx = Context.from_args(args)
        return int(args.func(args, ctx))
    except CorruptCheckpointError as exc:
        _error(str(exc))
        return EXIT_CHECK_FAILED
    except CkptStoreError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `ckptstore-tool ls ROOT | head`
        sys.stderr.close()
        return EXIT_OK
    except OSError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except Exception:  # noqa: BLE001 - anything else is a bug: show it
        traceback.print_exc()
        _error("internal error (a bug in ckptstore-tool: please report it with the traceback)")
        return EXIT_INTERNAL
    finally:
        if ctx is not None:
            ctx.close()


if __name__ == "__main__":
    sys.exit(main())
