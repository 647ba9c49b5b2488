"""Codecs end to end on a volume: the manifest records ``<name>/<version>``, a reader looks
it up in the registry (never guessing), a registered third codec round-trips through
``ckptstore.writer`` / ``reader``, transcode and ``ckptstore-tool convert --compress``."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch.distributed.checkpoint as dcp

import ckptstore
from ckptstore.cli.main import main as cli_main
from ckptstore.config import WriterOptions
from ckptstore.dcp.transcode import transcode
from ckptstore.engine.codec_registry import get_codec, register_codec
from ckptstore.engine.codecs import Codec
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, Marker
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import ConfigError, CorruptCheckpointError, MissingDependencyError
from ckptstore.stores.local import LocalStore
from tests.dcp.test_dropin_zstd import _blank, _equal, _state

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


class XorCodec(Codec):
    """A third codec: every byte XOR 0x5A (so a misread would be garbage, never equal)."""

    name = "test-xor"

    def encode_unchecked(self, data: memoryview) -> bytes:
        return (np.frombuffer(data, np.uint8) ^ 0x5A).tobytes()

    def decode_unchecked(self, data: bytes | bytearray | memoryview, raw_length: int | None):
        return (np.frombuffer(data, np.uint8) ^ 0x5A).tobytes()


register_codec(XorCodec(), replace=True)  # replace: this module may be imported again


def _doc(step_dir: Path) -> dict:
    return json.loads((step_dir / MANIFEST_NAME).read_bytes())  # type: ignore[no-any-return]


def _resign(step_dir: Path, doc: dict) -> None:
    """Rewrite the canonical manifest and a marker committing it (as an older ckptstore,
    another tool or an attacker able to write the directory could)."""
    data = json.dumps(doc).encode()
    old = json.loads((step_dir / MARKER_NAME).read_bytes())
    (step_dir / MANIFEST_NAME).write_bytes(data)
    (step_dir / MARKER_NAME).write_bytes(
        Marker.for_manifest(data, old["step"], old["attempt"]).to_bytes()
    )


def test_the_manifest_records_versioned_descriptors_and_old_bare_names_still_load(
    tmp_path: Path,
) -> None:
    plain, packed = tmp_path / "step_000000001", tmp_path / "step_000000002"
    ckptstore.save(_state(), ckptstore.writer(str(plain)))
    ckptstore.save(_state(), ckptstore.writer(str(packed), WriterOptions(codec="zstd")))
    assert _doc(plain)["codec"] == "none"  # what older ckptstore readers understand
    assert _doc(packed)["codec"] == "zstd/1"
    for step_dir in (plain, packed):
        r = ckptstore.reader(str(step_dir))
        assert r.manifest_codec.descriptor == ("none/1" if step_dir is plain else "zstd/1")
    # A manifest written before descriptors were versioned says plain "zstd".
    doc = _doc(packed)
    _resign(packed, {**doc, "codec": "zstd"})
    got = _blank()
    ckptstore.load(got, str(packed))
    assert _equal(got, _state())
    assert ckptstore.reader(str(packed)).manifest.codec_descriptor == "zstd/1"


@pytest.mark.parametrize("descriptor", ["lz4/1", "zstd/2", "test-xor/9"])
def test_an_unknown_codec_in_a_manifest_is_refused_by_name(tmp_path: Path, descriptor: str) -> None:
    step_dir = tmp_path / "step_000000003"
    ckptstore.save(_state(), ckptstore.writer(str(step_dir), WriterOptions(codec="zstd")))
    _resign(step_dir, {**_doc(step_dir), "codec": descriptor})
    pattern = rf"records codec '{descriptor}', which this ckptstore does not know.*upgrade"
    with pytest.raises(CorruptCheckpointError, match=pattern):
        ckptstore.reader(str(step_dir))
    with pytest.raises(CorruptCheckpointError, match=pattern):
        ckptstore.load(_blank(), str(step_dir))
    # Listing and inspecting still work: only decoding needs the codec.
    assert cli_main(["inspect", str(step_dir), "--json"]) == 0


def test_a_registered_codec_round_trips_through_writer_reader_and_transcode(
    tmp_path: Path,
) -> None:
    url = tmp_path / "step_000000004"
    writer = ckptstore.writer(str(url), WriterOptions(codec="test-xor"))
    assert pickle.loads(pickle.dumps(writer))._codec == get_codec("test-xor")
    ckptstore.save(_state(), writer)
    doc = _doc(url)
    assert doc["codec"] == "test-xor/1"
    assert all(r["raw_length"] == r["length"] for r in doc["ranges"] if r["file"] != ".metadata")
    got = _blank()
    ckptstore.load(got, str(url))
    assert _equal(got, _state())
    # Stock DCP cannot decode it and says so (it is named in .metadata), not a misread.
    with pytest.raises(BaseException, match=r"ckptstore\.test-xor"):  # noqa: B017, PT011
        dcp.load(_blank(), storage_reader=dcp.FileSystemReader(str(url)))
    # Transcoded to none it is stock DCP again.
    plain = tmp_path / "plain"
    with TransferEngine() as engine:
        transcode(LocalStore(str(url)), LocalStore(str(plain)), engine, codec="none")
    stock = _blank()
    dcp.load(stock, storage_reader=dcp.FileSystemReader(str(plain)))
    assert _equal(stock, _state())


def test_convert_offers_the_registered_codecs(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    src, dst = tmp_path / "step_000000005", tmp_path / "out"
    ckptstore.save(_state(), ckptstore.writer(str(src)))
    assert cli_main(["convert", str(src), str(dst), "--to", "dcp", "--compress", "test-xor"]) == 0
    assert _doc(dst)["codec"] == "test-xor/1"
    assert "(dcp, test-xor)" in capsys.readouterr().out
    got = _blank()
    ckptstore.load(got, str(dst))
    assert _equal(got, _state())
    assert (
        cli_main(["convert", str(src), str(tmp_path / "x"), "--to", "dcp", "--compress", "lz5"])
        == 2
    )
    err = capsys.readouterr().err
    assert "invalid choice: 'lz5'" in err and "test-xor" in err and "zstd" in err


def test_writers_and_managers_refuse_an_unknown_codec_listing_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown codec 'lz5'; choose one of none, .*zstd"):
        ckptstore.writer(str(tmp_path / "a"), WriterOptions(codec="lz5"))
    with pytest.raises(ConfigError, match=r"unknown codec 'lz5'; choose one of none, .*zstd"):
        ckptstore.CheckpointManager(str(tmp_path / "root"), writer=WriterOptions(codec="lz5"))
    assert not (tmp_path / "a").exists()


def test_a_zstd_checkpoint_without_zstandard_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "step_000000006")
    ckptstore.save(_state(), ckptstore.writer(url, WriterOptions(codec="zstd")))
    monkeypatch.setitem(sys.modules, "zstandard", None)  # `import zstandard` now fails
    with pytest.raises(MissingDependencyError, match=r"pip install 'ckptstore\[zstd\]'"):
        ckptstore.reader(url)
    with pytest.raises(MissingDependencyError, match=r"pip install 'ckptstore\[zstd\]'"):
        ckptstore.writer(str(tmp_path / "b"), WriterOptions(codec="zstd"))
    assert cli_main(["ls", str(tmp_path)]) == 0  # listing needs no codec
