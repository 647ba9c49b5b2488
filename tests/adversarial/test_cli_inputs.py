"""``ckptstore-tool`` under hostile input: every subcommand, every kind of bad file or option.

One module-wide folder holds the inputs: damaged ``torch.save`` / safetensors files, a
committed checkpoint with a truncated shard, garbage manifests / markers / ``.metadata``,
stock and torn checkpoints whose ``.metadata`` is a pickle that would create ``PWNED`` if it
ever ran, a committed checkpoint re-signed around such a ``.metadata``, and committed ones
whose object entries are a pickle that would run code or a class that weights-only loading
refuses. Each case runs the real CLI entry point (``ckptstore.cli.main.main``, in-process)
and checks what a user sees: no traceback, the documented exit code, a one- or two-line
message naming the file, and that no pickle ran. Endpoints are 127.0.0.1 on a closed port.
"""

from __future__ import annotations

import fractions
import io
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptstore
from ckptstore.engine.checksum import crc32c, format_crc
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, Marker
from tests.adversarial.clirun import closed_port, run_cli

PWNED = "PWNED"


class _Payload:
    """Pickles as "create the file PWNED next to the inputs"; runs only if unpickled."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (shutil.copyfile, (os.devnull, self.target))


def _save(url: str, state: dict[str, Any]) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ckptstore.save(state, ckptstore.writer(url))
    return url


def _resign(step: Path, metadata: bytes) -> None:
    """Replace ``step``'s ``.metadata`` and re-sign the manifest and marker around it, as an
    attacker with write access to the bucket can: the checksums then all match."""
    doc = json.loads((step / MANIFEST_NAME).read_bytes())
    doc["files"][".metadata"] = {"size": len(metadata), "crc32c": format_crc(crc32c(metadata))}
    manifest = json.dumps(doc).encode()
    marker = json.loads((step / MARKER_NAME).read_bytes())
    for name in os.listdir(step):
        if name.startswith((".metadata.", "ckptstore.manifest.")):
            os.remove(step / name)
    (step / ".metadata").write_bytes(metadata)
    (step / MANIFEST_NAME).write_bytes(manifest)
    marker_bytes = Marker.for_manifest(manifest, doc["step"], marker["attempt"]).to_bytes()
    (step / MARKER_NAME).write_bytes(marker_bytes)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hostile")
    evil = _Payload(str(d / PWNED))
    evil_pickle = __import__("pickle").dumps(evil)
    state = {"model": {"w": torch.randn(256, 256)}, "step": 7, "meta": {"name": "run"}}

    _save(str(d / "run" / "step_000000001"), state)
    trunc = d / "trunc" / "step_000000001"
    _save(str(trunc), state)
    shard = next(n for n in os.listdir(trunc) if n.endswith(".distcp"))
    os.truncate(trunc / shard, 1000)
    (d / "shard_name").write_text(shard)

    for name in ("badman", "badmark", "resigned"):
        shutil.copytree(d / "run" / "step_000000001", d / name)
    for n in os.listdir(d / "badman"):
        if n.startswith("ckptstore.manifest"):
            (d / "badman" / n).write_bytes(b'{"files": [], garbage')
    (d / "badmark" / MARKER_NAME).write_bytes(b"\x00\xffnot json")
    _resign(d / "resigned", evil_pickle)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(d / "stock")), no_dist=True)
    shutil.copytree(d / "stock", d / "evilstock")
    (d / "evilstock" / ".metadata").write_bytes(evil_pickle)
    shutil.copytree(d / "stock", d / "garbagemeta")
    (d / "garbagemeta" / ".metadata").write_bytes(os.urandom(64))

    shutil.copytree(d / "stock", d / "emptymeta")
    (d / "emptymeta" / ".metadata").write_bytes(b"")
    shutil.copytree(d / "stock", d / "garbageshard")
    for n in os.listdir(d / "garbageshard"):
        if n.endswith(".distcp"):
            size = (d / "garbageshard" / n).stat().st_size
            (d / "garbageshard" / n).write_bytes(os.urandom(size))
    shutil.copytree(d / "run" / "step_000000001", d / "markerdir")
    os.remove(d / "markerdir" / MARKER_NAME)
    (d / "markerdir" / MARKER_NAME).mkdir()

    torn = d / "eviltorn"
    shutil.copytree(d / "run" / "step_000000001", torn)
    os.remove(torn / MARKER_NAME)
    for n in os.listdir(torn):
        if n.startswith(".metadata"):
            (torn / n).write_bytes(evil_pickle)

    _save(str(d / "evilobj"), {"w": torch.ones(4), "payload": evil})
    _save(str(d / "fracobj"), {"w": torch.ones(4), "ratio": fractions.Fraction(1, 3)})

    buf = io.BytesIO()
    torch.save(state, buf)
    full = buf.getvalue()
    (d / "full.pt").write_bytes(full)
    (d / "trunc.pt").write_bytes(full[: len(full) // 2])
    (d / "garbage.pt").write_bytes(os.urandom(4096))
    (d / "empty.pt").write_bytes(b"")
    buf = io.BytesIO()
    torch.save({"ratio": fractions.Fraction(1, 3)}, buf)
    (d / "frac.pt").write_bytes(buf.getvalue())
    buf = io.BytesIO()
    torch.save({"payload": evil}, buf)
    (d / "evil.pt").write_bytes(buf.getvalue())
    from safetensors.torch import save

    st = save({"w": torch.randn(64, 64)})
    (d / "m.safetensors").write_bytes(st)
    (d / "trunc.safetensors").write_bytes(st[: len(st) // 2])
    (d / "garbage.safetensors").write_bytes(b"\x10" + b"\x00" * 7 + b"{\xff\xfe" + os.urandom(64))
    (d / "notes").mkdir()
    (d / "notes" / "readme.txt").write_text("not a checkpoint")
    (d / "emptydir").mkdir()
    return d


#: (id, argv with {d} for the inputs folder and {port} for a closed port, exit code,
#:  what the message must name, text the output must hold). Exit codes as docs/cli.md says.
CASES: list[tuple[str, str, int, str, str]] = [
    # ls
    ("ls-missing", "ls {d}/nope", 2, "{d}/nope", "nothing at"),
    ("ls-file", "ls {d}/full.pt", 2, "{d}/full.pt", "is a file, not a folder"),
    ("ls-ftp-closed", "ls ftp://127.0.0.1:{port}/run1", 2, "ftp://127.0.0.1:{port}/run1", ""),
    (
        "ls-s3-closed",
        "ls s3://bucket/run1 -o endpoint_url=http://127.0.0.1:{port} -o key=a -o secret=b",
        2,
        "s3://bucket/run1",
        "127.0.0.1:{port}",
    ),
    (
        "ls-gs-closed",
        "ls gs://bucket/run1 -o endpoint_url=http://127.0.0.1:{port} -o token=anon",
        2,
        "gs://bucket/run1",
        "127.0.0.1:{port}",
    ),
    (
        "ls-s3-unknown-option",
        "ls s3://bucket/run1 -o endpoint_url=http://127.0.0.1:{port} -o no_such_option=1",
        2,
        "s3://bucket/run1",
        "'no_such_option'",
    ),
    (
        "ls-s3-bad-option-type",
        "ls s3://bucket/run1 -o endpoint_url=http://127.0.0.1:{port} -o client_kwargs=3",
        2,
        "s3://bucket/run1",
        "client_kwargs",
    ),
    (
        "ls-s3-bad-endpoint",
        "ls s3://bucket/run1 -o endpoint_url=not-a-url",
        2,
        "s3://bucket/run1",
        "endpoint_url=not-a-url",
    ),
    (
        "ls-az-bad-connection-string",
        "ls az://container/run1 -o connection_string=garbage",
        2,
        "az://container/run1",
        "connection_string",
    ),
    (
        "ls-s3-partial-credentials",
        "ls s3://bucket/run1 -o endpoint_url=http://127.0.0.1:{port} -o key=abc",
        2,
        "s3://bucket/run1",
        "-o key=... -o secret=...",
    ),
    ("ls-option-no-value", "ls {d}/run -o novalue", 2, "novalue", "key=value"),
    (
        "ls-unknown-flag",
        "ls {d}/run --no-such-flag",
        2,
        "--no-such-flag",
        "usage: ckptstore-tool ls",
    ),
    ("ls-bad-scheme", "ls nosuchscheme://x/y", 2, "nosuchscheme://x/y", "scheme"),
    ("ls-concurrency-0", "ls {d}/run --concurrency 0", 2, "--concurrency", ""),
    ("ls-part-size-neg", "ls {d}/run --part-size-mib -1", 2, "--part-size-mib", ""),
    ("ls-stale-neg", "ls {d}/run --stale-after-hours -5", 2, "'-5'", "usage: ckptstore-tool ls"),
    ("gc-stale-nan", "gc {d}/run --stale-after-hours nan", 2, "'nan'", "usage: ckptstore-tool gc"),
    # inspect
    ("inspect-missing", "inspect {d}/nope", 2, "{d}/nope", "nothing at"),
    ("inspect-emptydir", "inspect {d}/emptydir", 2, "{d}/emptydir", "nothing at"),
    ("inspect-not-ckpt", "inspect {d}/notes", 2, "{d}/notes", "not a checkpoint"),
    ("inspect-empty-pt", "inspect {d}/empty.pt", 1, "{d}/empty.pt", "empty"),
    ("inspect-trunc-pt", "inspect {d}/trunc.pt", 1, "{d}/trunc.pt", "not a readable torch.save"),
    ("inspect-garbage-pt", "inspect {d}/garbage.pt", 1, "{d}/garbage.pt", "not a readable"),
    ("inspect-trunc-st", "inspect {d}/trunc.safetensors", 1, "{d}/trunc.safetensors", ""),
    ("inspect-garbage-st", "inspect {d}/garbage.safetensors", 1, "garbage.safetensors", ""),
    ("inspect-frac-pt", "inspect {d}/frac.pt", 2, "{d}/frac.pt", "--allow-pickle"),
    ("inspect-evil-pt", "inspect {d}/evil.pt", 2, "{d}/evil.pt", "--allow-pickle"),
    ("inspect-trunc-shard", "inspect {d}/trunc/step_000000001", 1, "{shard}", "DAMAGED"),
    ("inspect-bad-manifest", "inspect {d}/badman", 1, "{d}/badman", "CORRUPT"),
    ("inspect-bad-marker", "inspect {d}/badmark", 1, "COMMITTED", "CORRUPT"),
    ("inspect-resigned-evil-meta", "inspect {d}/resigned", 1, ".metadata", "DAMAGED"),
    ("inspect-evil-stock-meta", "inspect {d}/evilstock", 1, ".metadata", "DAMAGED"),
    ("inspect-garbage-stock-meta", "inspect {d}/garbagemeta", 1, ".metadata", "DAMAGED"),
    ("inspect-evil-torn-meta", "inspect {d}/eviltorn", 0, ".metadata", "INCOMPLETE"),
    (
        "inspect-unknown-flag",
        "inspect {d}/run --bogus",
        2,
        "--bogus",
        "usage: ckptstore-tool inspect",
    ),
    ("inspect-empty-stock-meta", "inspect {d}/emptymeta", 1, ".metadata", "DAMAGED"),
    ("inspect-marker-is-dir", "inspect {d}/markerdir", 1, "{d}/markerdir", "is a directory"),
    # verify
    ("verify-missing", "verify {d}/nope", 2, "{d}/nope", "nothing at"),
    ("verify-file", "verify {d}/full.pt", 2, "{d}/full.pt", "no manifest"),
    ("verify-not-ckpt", "verify {d}/notes", 2, "{d}/notes", "not a checkpoint"),
    ("verify-trunc-shard", "verify {d}/trunc/step_000000001", 1, "{shard}", "FAILED"),
    ("verify-bad-manifest", "verify {d}/badman", 1, "{d}/badman", "FAILED"),
    ("verify-bad-marker", "verify {d}/badmark", 1, "COMMITTED", "FAILED"),
    ("verify-evil-stock-meta", "verify {d}/evilstock", 1, ".metadata", "FAILED"),
    ("verify-garbage-stock-meta", "verify {d}/garbagemeta", 1, ".metadata", "FAILED"),
    ("verify-empty-stock-meta", "verify {d}/emptymeta", 1, ".metadata", "FAILED"),
    ("verify-marker-is-dir", "verify {d}/markerdir", 1, "{d}/markerdir", "is a directory"),
    # convert
    (
        "convert-garbage-stock-shard",
        "convert {d}/garbageshard {d}/out-k.pt --to torch",
        1,
        "{d}/garbageshard",
        "damaged",
    ),
    ("convert-trunc-pt", "convert {d}/trunc.pt {d}/out-a --to dcp", 1, "{d}/trunc.pt", ""),
    ("convert-garbage-pt", "convert {d}/garbage.pt {d}/out-b --to dcp", 1, "{d}/garbage.pt", ""),
    (
        "convert-trunc-st",
        "convert {d}/trunc.safetensors {d}/out-c.pt --to torch",
        1,
        "{d}/trunc.safetensors",
        "",
    ),
    (
        "convert-evil-pt",
        "convert {d}/evil.pt {d}/out-d --to dcp",
        2,
        "{d}/evil.pt",
        "--allow-pickle",
    ),
    (
        "convert-evil-stock-meta",
        "convert {d}/evilstock {d}/out-e.pt --to torch",
        1,
        ".metadata",
        "",
    ),
    ("convert-evil-stock-to-dcp", "convert {d}/evilstock {d}/out-f --to dcp", 1, ".metadata", ""),
    (
        "convert-resigned-evil-meta",
        "convert {d}/resigned {d}/out-g.pt --to torch",
        1,
        ".metadata",
        "",
    ),
    (
        "convert-evil-object-to-torch",
        "convert {d}/evilobj {d}/out-h.pt --to torch",
        2,
        "payload",
        "--allow-pickle",
    ),
    (
        "convert-frac-object-to-torch",
        "convert {d}/fracobj {d}/out-i.pt --to torch",
        2,
        "ratio",
        "fractions.Fraction",
    ),
    (
        "convert-to-dir",
        "convert {d}/run/step_000000001 {d}/emptydir --to torch",
        2,
        "{d}/emptydir",
        "",
    ),
    (
        "convert-dcp-to-file",
        "convert {d}/run/step_000000001 {d}/full.pt --to dcp",
        2,
        "{d}/full.pt",
        "",
    ),
    (
        "convert-bad-target",
        "convert {d}/full.pt {d}/x --to onnx",
        2,
        "onnx",
        "usage: ckptstore-tool convert",
    ),
    ("convert-missing", "convert {d}/nope {d}/out-j --to dcp", 2, "{d}/nope", "nothing at"),
    # cp
    ("cp-missing", "cp {d}/nope {d}/cp-a", 2, "{d}/nope", "nothing at"),
    ("cp-file", "cp {d}/full.pt {d}/cp-b", 2, "{d}/full.pt", "is a file"),
    ("cp-stock", "cp {d}/stock {d}/cp-c", 2, "{d}/stock", "stock DCP"),
    ("cp-bad-manifest", "cp {d}/badman {d}/cp-d", 1, "{d}/badman", ""),
    ("cp-same", "cp {d}/run/step_000000001 {d}/run/step_000000001", 2, "", "same"),
    # gc
    ("gc-missing", "gc {d}/nope --keep-last 1", 2, "{d}/nope", "nothing at"),
    ("gc-file", "gc {d}/full.pt --keep-last 1", 2, "{d}/full.pt", "is a file"),
    ("gc-bad-int", "gc {d}/run --keep-last x", 2, "'x'", "usage: ckptstore-tool gc"),
    # diff
    ("diff-missing", "diff {d}/nope {d}/full.pt", 2, "{d}/nope", "nothing at"),
    ("diff-garbage", "diff {d}/garbage.safetensors {d}/full.pt", 1, "garbage.safetensors", ""),
    ("diff-evil-object", "diff {d}/evilobj {d}/evilobj", 2, "payload", "--allow-pickle"),
    ("diff-evil-stock-meta", "diff {d}/evilstock {d}/stock", 1, ".metadata", ""),
    ("diff-negative-atol", "diff {d}/full.pt {d}/full.pt --atol -1", 2, "'-1'", "usage:"),
    ("diff-nan-batch", "diff {d}/full.pt {d}/full.pt --batch-mib nan", 2, "'nan'", "usage:"),
    # goodput
    ("goodput-bad-afr", "goodput --gpus 8 --afr zz", 2, "'zz'", "usage: ckptstore-tool goodput"),
    ("goodput-from-missing", "goodput --gpus 8 --afr 1% --from {d}/nope", 2, "{d}/nope", ""),
    # top level
    ("unknown-command", "nosuchcommand x", 2, "nosuchcommand", "usage: ckptstore-tool"),
]


def _fill(text: str, d: Path, port: int) -> str:
    return text.format(d=d, port=port, shard=(d / "shard_name").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_input(
    case: tuple[str, str, int, str, str], inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, argv, code, names, says = case
    port = closed_port()
    rc, out, err = run_cli(capsys, _fill(argv, inputs, port).split())
    both = out + err
    assert "Traceback" not in both, both
    assert rc == code, both
    assert _fill(names, inputs, port) in both, both
    assert _fill(says, inputs, port) in both, both
    if rc != 0 and not out:  # an error: a one- or two-line message (argparse adds its usage)
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("note:")]
        assert 1 <= len(lines) <= 2 or lines[0].startswith("usage:"), err
    assert _unknown_flags(both, argv.split()) == set(), both
    assert "storage_options" not in both and "overwrite=True" not in both, both  # Python words
    assert not (inputs / PWNED).exists(), f"{argv} ran a pickle"


def _unknown_flags(text: str, argv: list[str]) -> set[str]:
    """The ``--flags`` ``text`` advises that the command (``argv[0]``) does not have
    (a suggested other command, `` `ckptstore-tool convert --to dcp` ``, has its own)."""
    from ckptstore.cli.main import _subcommand_parser, build_parser

    sub = _subcommand_parser(build_parser(), argv[0])
    if sub is None:
        return set()
    known = {o for a in sub._actions for o in a.option_strings}
    other = rf"`ckptstore-tool (?!{argv[0]} )[^`]*`"
    message = re.sub(other, "", text.split("error:", 1)[-1])
    advised = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", message))
    return advised - known - set(argv)


def test_allow_pickle_is_the_opt_in(inputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The flag every refusal names exists and does what it says: trusted objects load."""
    rc, out, err = run_cli(capsys, ["inspect", str(inputs / "frac.pt"), "--allow-pickle"])
    assert rc == 0 and "ratio" in out, err
    dst = inputs / "frac-opt-in.pt"
    rc, out, err = run_cli(
        capsys, ["convert", str(inputs / "fracobj"), str(dst), "--to", "torch", "--allow-pickle"]
    )
    assert rc == 0, err
    loaded = torch.load(dst, weights_only=False)
    assert loaded["ratio"] == fractions.Fraction(1, 3)


def test_drop_objects_never_reads_objects(inputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--to safetensors --drop-objects`` leaves object entries unread, so a hostile one
    cannot run and is not even refused: the tensors convert."""
    from safetensors.torch import load

    dst = inputs / "evilobj.safetensors"
    rc, _, err = run_cli(
        capsys,
        ["convert", str(inputs / "evilobj"), str(dst), "--to", "safetensors", "--drop-objects"],
    )
    assert rc == 0, err
    assert torch.equal(load(dst.read_bytes())["w"], torch.ones(4))
    assert not (inputs / PWNED).exists()


def test_inspect_reports_real_sizes(inputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A truncated shard shows its real size beside the manifest's, status damaged."""
    shard = (inputs / "shard_name").read_text()
    rc, out, _ = run_cli(capsys, ["inspect", str(inputs / "trunc" / "step_000000001"), "--json"])
    doc = json.loads(out)
    assert rc == 1 and doc["status"] == "damaged"
    f = next(f for f in doc["files"] if f["name"] == shard)
    assert f["size"] == 1000 and f["expected_size"] > 1000
    assert any(shard in n and "1000 bytes" in n for n in doc["notes"])


def test_internal_error_is_one_line_asking_for_a_report(
    inputs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The safety net: a bug (here: a command that raises something unexpected) is one
    line with "please report" and exit 3; the traceback only on request."""
    from ckptstore.cli import cmd_ls

    def broken(*_: Any) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(cmd_ls, "run", broken)
    argv = ["ls", str(inputs / "run")]
    rc, out, err = run_cli(capsys, argv)
    assert rc == 3 and "Traceback" not in err and "please report" in err and "boom" in err
    assert len(err.strip().splitlines()) == 1
    monkeypatch.setenv("CKPTSTORE_TOOL_TRACEBACK", "1")
    rc, _, err = run_cli(capsys, argv)
    assert rc == 3 and "Traceback" in err and "please report" in err


def test_help_of_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(capsys, ["--help"])
    assert rc == 0 and "exit codes" in out
    for command in ("ls", "inspect", "verify", "convert", "cp", "gc", "diff", "goodput"):
        rc, out, err = run_cli(capsys, [command, "--help"])
        assert rc == 0 and f"usage: ckptstore-tool {command}" in out, err
