"""``ckptstore-tool``: argument parsing, dispatch, and the error -> exit code mapping.

Exit codes (the same for every subcommand):

====  ===========================================================================
0     success
1     a check failed: ``verify`` / ``ls`` / ``inspect`` found damage, ``diff`` found
      differences, a file is not a readable torch.save / safetensors file, or a copy /
      conversion stopped on bytes that do not match the manifest
2     usage or access error: bad arguments, nothing at the URL, not a checkpoint,
      an incomplete checkpoint where a committed one is needed, an existing
      destination without ``--force``, credentials or storage options refused, a store
      that cannot be reached, objects that need ``--allow-pickle``, a missing extra
3     internal error (a bug): one line saying so and asking for a report; the
      traceback only with ``CKPTSTORE_TOOL_TRACEBACK=1``
130   interrupted (Ctrl-C); ``cp`` / ``convert`` leave nothing committed
====  ===========================================================================

Every failure is one line on stderr, without a traceback (``ckptstore.cli.exit_codes``).
A usage error after a subcommand prints that subcommand's usage.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Sequence

from ckptstore.cli import (
    cmd_convert,
    cmd_cp,
    cmd_diff,
    cmd_gc,
    cmd_goodput,
    cmd_inspect,
    cmd_ls,
    cmd_pack,
    cmd_verify,
)
from ckptstore.cli.context import Context, add_common_arguments
from ckptstore.cli.exit_codes import (
    EXIT_CHECK_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    TRACEBACK_ENV,
    explain,
)
from ckptstore.cli.render import guard, guarded_output, safe, unguarded
from ckptstore.redact import redact

__all__ = [
    "main",
    "build_parser",
    "EXIT_OK",
    "EXIT_CHECK_FAILED",
    "EXIT_USAGE",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
]

_EPILOG = """\
exit codes: 0 ok; 1 check failed (damage found, checkpoints differ, unreadable file); 2 usage
or access error (bad arguments, nothing at the URL, not a checkpoint, incomplete checkpoint,
destination exists, store unreachable, needs --allow-pickle); 3 internal error (a bug: please
report it); 130 interrupted.

URLs: a path or file://, s3://, gs://, az:// / abfs://. Credentials and endpoints go in
-o/--storage-option KEY=VALUE (after the subcommand), e.g.
  ckptstore-tool ls s3://bucket/run1 -o endpoint_url=http://127.0.0.1:8333 -o key=... -o secret=...
"""

COMMANDS = (
    cmd_ls,
    cmd_inspect,
    cmd_verify,
    cmd_convert,
    cmd_cp,
    cmd_gc,
    cmd_diff,
    cmd_goodput,
    cmd_pack,
)

#: The argument names that hold a command's URLs, in the order they are named in errors.
_URL_ARGS = ("root", "ckpt", "src", "dst", "a", "b", "from_root")


def build_parser() -> argparse.ArgumentParser:
    """The ``ckptstore-tool`` argument parser with every subcommand registered."""
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


def _subcommand_parser(
    parser: argparse.ArgumentParser, name: str | None
) -> argparse.ArgumentParser | None:
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            found = action.choices.get(name) if name else None
            return found if isinstance(found, argparse.ArgumentParser) else None
    return None


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, except that an argument the subcommand does not know is that
    subcommand's usage error (its usage line), not the top-level one. May raise SystemExit."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        owner = _subcommand_parser(parser, getattr(args, "command", None)) or parser
        owner.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _error(message: str) -> None:
    """The one line a failure prints: credentials redacted, control characters escaped."""
    print(f"ckptstore-tool: error: {safe(redact(message))}", file=sys.stderr)


def _quiet_library_chatter() -> None:
    # DCP warns that it runs without a process group; the CLI always does, on purpose.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*torch.distributed.*disabled.*")
    warnings.filterwarnings("ignore", message=".*process group.*")
    warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
    handler = logging.StreamHandler(unguarded(sys.stderr))
    handler.setFormatter(_GuardedFormatter("ckptstore-tool: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


class _GuardedFormatter(logging.Formatter):
    """Log lines as ``GuardedStream`` writes text: redacted, control characters escaped."""

    def format(self, record: logging.LogRecord) -> str:
        return guard(super().format(record))


def _urls(args: argparse.Namespace) -> list[str]:
    return [str(v) for k in _URL_ARGS if (v := getattr(args, k, None))]


def _options_given(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    for name in ("storage_option", "src_option", "dst_option"):
        out += getattr(args, name, None) or []
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``ckptstore-tool`` command; returns the exit code (never raises SystemExit)."""
    parser = build_parser()
    with guarded_output():  # what it prints: credentials redacted, controls escaped
        try:
            args = parse_args(parser, list(argv) if argv is not None else None)
        except SystemExit as exc:  # --help, --version, or a usage error argparse printed
            return int(exc.code or 0) if isinstance(exc.code, int) else EXIT_USAGE
        _quiet_library_chatter()
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    ctx: Context | None = None
    try:
        ctx = Context.from_args(args)
        return int(args.func(args, ctx))
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `ckptstore-tool ls ROOT | head`
        unguarded(sys.stderr).close()
        return EXIT_OK
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        code, message = explain(exc, _urls(args), _options_given(args))
        if code == EXIT_INTERNAL and os.environ.get(TRACEBACK_ENV):
            traceback.print_exception(exc, file=sys.stderr)
        _error(message)
        return code
    finally:
        if ctx is not None:
            try:
                ctx.close()
            except Exception as exc:  # noqa: BLE001 - the command's own result stands
                _error(f"while closing: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
