"""The codec registry (``ckptstore.engine.codec_registry``) and the manifest's codec descriptor."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import zstandard

from ckptstore.engine.codec_registry import (
    codec_names,
    find_codec,
    get_codec,
    parse_descriptor,
    register_codec,
    stored_codec,
    transform_codec,
)
from ckptstore.engine.codecs import Codec, NoneCodec, ZstdCodec
from ckptstore.engine.manifest import Manifest
from ckptstore.errors import ConfigError, CorruptCheckpointError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Reverse(Codec):
    """A third codec for these tests: the bytes reversed (version 7, to test versions)."""

    name = "test-reverse"
    version = 7

    def encode_unchecked(self, data: memoryview) -> bytes:
        return bytes(data)[::-1]

    def decode_unchecked(self, data: bytes | bytearray | memoryview, raw_length: int | None):
        return bytes(data)[::-1]


register_codec(_Reverse(), replace=True)  # replace: this module may be imported again


def test_builtins_are_named_by_versioned_descriptors() -> None:
    assert codec_names()[:1] == ("none",) and {"none", "zstd", "test-reverse"} <= set(codec_names())
    assert get_codec("zstd").descriptor == "zstd/1" and get_codec("zstd/1") is get_codec("zstd")
    assert get_codec("none").descriptor == "none/1" and get_codec("none").identity
    assert get_codec("test-reverse").descriptor == "test-reverse/7"  # a name: its newest
    assert get_codec("zstd").dcp_transform == "stream.zstd/1"
    assert get_codec("none").dcp_transform is None
    assert get_codec("test-reverse").dcp_transform == "ckptstore.test-reverse/7"


@pytest.mark.parametrize("spec", ["lz4", "zstd/2", "ZSTD", "zstd/one", "", "zstd/1/1"])
def test_an_unknown_codec_for_a_writer_is_a_config_error_listing_the_choices(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"unknown codec .*choose one of none, .*zstd"):
        get_codec(spec)


def test_parse_descriptor() -> None:
    assert parse_descriptor("zstd") == ("zstd", 1)  # a bare name (old manifests): version 1
    assert parse_descriptor("zstd/1") == ("zstd", 1)
    assert parse_descriptor("my.codec-2/12") == ("my.codec-2", 12)
    for bad in ("", "Zstd", "zstd/0", "zstd/01", "zstd/", "/1", "zstd/1.0", "a b", "x" * 65):
        assert parse_descriptor(bad) is None, bad


def test_registering_a_taken_descriptor_or_a_bad_codec_is_refused() -> None:
    with pytest.raises(ConfigError, match="zstd/1 is already registered"):
        register_codec(ZstdCodec())
    assert register_codec(ZstdCodec(), replace=True) is not None

    class Bad(NoneCodec):
        name = "Bad Name"

    with pytest.raises(ConfigError, match="codec name"):
        register_codec(Bad())

    class BadVersion(NoneCodec):
        name, version = "badversion", 0

    with pytest.raises(ConfigError, match="version"):
        register_codec(BadVersion())
    with pytest.raises(ConfigError, match="Codec instance"):
        register_codec(ZstdCodec)  # type: ignore[arg-type]
    assert find_codec("badversion", 0) is None


def test_a_manifest_records_the_descriptor_and_reads_bare_names_as_version_1() -> None:
    m = Manifest(step=1, world_size=1, codec="zstd", codec_version=1)
    assert json.loads(m.to_bytes())["codec"] == "zstd/1"
    assert json.loads(Manifest(step=1, world_size=1).to_bytes())["codec"] == "none"
    for text, want in (("zstd", ("zstd", 1)), ("zstd/1", ("zstd", 1)), ("none", ("none", 1))):
        doc = {**json.loads(m.to_bytes()), "codec": text}
        back = Manifest.from_bytes(json.dumps(doc).encode(), "m.json")
        assert (back.codec, back.codec_version) == want
        assert stored_codec(back.codec_descriptor, "m.json") is get_codec(want[0])
    # A well-formed unknown codec parses (inspect / ls / verify still work) ...
    doc = {**json.loads(m.to_bytes()), "codec": "lz4/3"}
    back = Manifest.from_bytes(json.dumps(doc).encode(), "m.json")
    assert back.codec_descriptor == "lz4/3"
    # ... and a reader's lookup refuses it, naming it and what to do.
    with pytest.raises(CorruptCheckpointError, match=r"m\.json records codec 'lz4/3'.*upgrade"):
        stored_codec(back.codec_descriptor, "m.json")
    with pytest.raises(CorruptCheckpointError, match="zstd/2"):
        stored_codec("zstd/2", "m.json")
    with pytest.raises(CorruptCheckpointError, match="not a codec descriptor"):
        Manifest.from_bytes(json.dumps({**doc, "codec": "lz4 fast"}).encode(), "m.json")


def test_raw_lengths_are_capped_by_the_manifest_codecs_ratio() -> None:
    base = json.loads(Manifest(step=1, world_size=1).to_bytes())
    base["files"] = {"a": {"size": 10, "crc32c": "0"}}
    rng = {"file": "a", "offset": 0, "length": 10, "crc32c": "0"}

    def parse(codec: str, raw_length: int) -> Manifest:
        doc = {**base, "codec": codec, "ranges": [{**rng, "raw_length": raw_length}]}
        return Manifest.from_bytes(json.dumps(doc).encode(), "m.json")

    assert parse("zstd/1", 10 * 32768).ranges[0].raw_length == 10 * 32768
    with pytest.raises(CorruptCheckpointError, match="raw_length"):
        parse("zstd/1", 10 * 32768 + 1)
    assert parse("test-reverse/7", 10).ranges[0].raw_length == 10  # max_ratio 1
    with pytest.raises(CorruptCheckpointError, match="raw_length"):
        parse("test-reverse/7", 11)


def test_decode_checks_sizes_and_turns_codec_failures_into_corrupt_checkpoint_errors() -> None:
    zstd = get_codec("zstd")
    raw = os.urandom(1000) * 50
    frame = bytes(zstd.encode(memoryview(raw)))
    assert bytes(zstd.decode(frame, len(raw))) == raw
    assert bytes(zstd.decode(frame, None)) == raw  # a stock DCP frame: no recorded length
    with pytest.raises(CorruptCheckpointError, match=r"item x: .*cannot decode to"):
        zstd.decode(frame, len(frame) * ZstdCodec.max_ratio + 1, "item x")
    with pytest.raises(CorruptCheckpointError, match=r"item x does not decode with zstd/1"):
        zstd.decode(frame, len(raw) - 1, "item x")  # the frame declares another size
    with pytest.raises(CorruptCheckpointError, match=r"does not decode with zstd/1"):
        zstd.decode(b"not a zstd frame", 100)
    # A frame that records no size but decodes to another length than the manifest's.
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    with pytest.raises(CorruptCheckpointError, match=r"decodes to \d+ bytes"):
        zstd.decode(unsized, len(raw) + 1)
    rev = get_codec("test-reverse")
    assert rev.decode(rev.encode(memoryview(b"abc")), 3) == b"abc"
    with pytest.raises(CorruptCheckpointError, match="cannot decode to 4"):
        rev.decode(b"abc", 4)


def test_encode_refuses_what_max_ratio_would_not_let_a_reader_decode() -> None:
    class Halves(NoneCodec):  # "compresses" 2:1 but keeps the default max_ratio of 1
        name = "test-halves"

        def encode_unchecked(self, data: memoryview) -> bytes:
            return bytes(data[: len(data) // 2])

    with pytest.raises(ConfigError, match=r"test-halves/1 encoded 10 bytes into 5.*max_ratio"):
        Halves().encode(memoryview(b"0123456789"))


def test_dcp_transforms_map_onto_the_registry() -> None:
    assert transform_codec(None, "x") is None and transform_codec([], "x") is None
    assert transform_codec(["stream.zstd/1"], "x") is get_codec("zstd")
    assert transform_codec(["stream.zstd/1.2"], "x") is get_codec("zstd")  # DCP: major only
    assert transform_codec(["ckptstore.test-reverse/7"], "x") is get_codec("test-reverse")
    for bad in (["stream.zstd/2"], ["stream.rot13/1"], ["stream.zstd/1", "stream.zstd/1"]):
        with pytest.raises(CorruptCheckpointError, match=r"item a uses DCP stream transforms"):
            transform_codec(bad, "item a")


@pytest.mark.processes
def test_the_registry_imports_no_torch_and_zstandard_only_when_used() -> None:
    code = (
        "import sys\n"
        "import ckptstore.engine.codec_registry as c, ckptstore.engine.manifest\n"
        "assert 'torch' not in sys.modules and 'zstandard' not in sys.modules\n"
        "c.get_codec('zstd')\n"
        "assert 'zstandard' in sys.modules and 'torch' not in sys.modules\n"
        "sys.modules['zstandard'] = None\n"  # as if not installed
        "from ckptstore.errors import MissingDependencyError\n"
        "try:\n"
        "    c.get_codec('zstd')\n"
        "except MissingDependencyError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    raise SystemExit('no MissingDependencyError')\n"
    )
    env = {**os.environ, "PYTHONPATH": REPO}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'ckptstore[zstd]'" in out.stdout


_PLUGIN = """
from ckptstore.engine.codecs import Codec


class Rot(Codec):
    name = "plugin-rot"

    def encode_unchecked(self, data):
        return bytes((b + 1) % 256 for b in data)

    def decode_unchecked(self, data, raw_length):
        return bytes((b - 1) % 256 for b in data)
"""


@pytest.mark.processes
def test_installed_packages_add_codecs_through_the_entry_point_group(tmp_path) -> None:
    """A real distribution on sys.path (a .dist-info with entry_points.txt) is found by
    importlib.metadata in a fresh process; a broken entry is logged and skipped."""
    (tmp_path / "rot_plugin.py").write_text(_PLUGIN)
    info = tmp_path / "rot_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rot-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[ckptstore.codecs]\nrot = rot_plugin:Rot\nbroken = no_such_module:Codec\n"
    )
    code = (
        "from ckptstore.engine.codec_registry import codec_names, get_codec, stored_codec\n"
        "assert 'plugin-rot' in codec_names(), codec_names()\n"
        "c = get_codec('plugin-rot')\n"
        "assert c.decode(c.encode(memoryview(b'abc')), 3) == b'abc'\n"
        "print(stored_codec('plugin-rot/1', 'm.json').descriptor)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, str(tmp_path)])}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "plugin-rot/1"
    assert "codec plugin 'broken'" in out.stderr and "was not loaded" in out.stderr
