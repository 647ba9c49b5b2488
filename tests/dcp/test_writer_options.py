"""``WriterOptions``: the writer's settings given once reach the writer, and the keywords
they had before (``codec=``, ``key_layout=``, ``config=``) still work, with a warning."""

import dataclasses
import pickle
import warnings

import pytest
import torch

import ckptstore
from ckptstore.config import RetryConfig, TransferConfig, WriterOptions
from ckptstore.dcp.writer import shard_prefix
from ckptstore.engine.committed import open_committed
from ckptstore.stores.local import LocalStore

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

TRANSFER = TransferConfig(part_size=1 << 20, concurrency=3, retry=RetryConfig(attempts=2))
OPTIONS = WriterOptions(codec="zstd", key_layout="spread", transfer=TRANSFER)


def state() -> dict:
    return {"w": torch.arange(4096, dtype=torch.float32), "meta": {"step": 7}}


def written_as(path: str, options: WriterOptions) -> None:
    """The committed checkpoint at ``path`` was written with ``options``' codec and layout."""
    manifest = open_committed(LocalStore(path)).manifest
    assert manifest.codec == options.codec
    shards = [name for name in manifest.files if name.endswith(".distcp")]
    assert shards and all(n.startswith(shard_prefix(0, options.key_layout)) for n in shards)


def test_writer_takes_the_options_whole_and_they_survive_a_pickle(tmp_path) -> None:
    w = ckptstore.writer(str(tmp_path / "step_000000001"), OPTIONS)
    assert (w.codec, w.key_layout, w.config, w.engine.config) == (
        "zstd",
        "spread",
        TRANSFER,
        TRANSFER,
    )
    again = pickle.loads(pickle.dumps(w))  # dcp.async_save's process executor sends it
    assert (again.codec, again.key_layout, again.config) == ("zstd", "spread", TRANSFER)
    ckptstore.save(state(), w)
    written_as(w.url, OPTIONS)
    path = str(tmp_path / "step_000000002")
    ckptstore.save(state(), path, options=OPTIONS)  # ckptstore.save passes it on to writer()
    written_as(path, OPTIONS)


def test_the_old_writer_keywords_warn_naming_the_new_spelling_and_still_work(tmp_path) -> None:
    path = str(tmp_path / "step_000000001")
    with pytest.warns(DeprecationWarning) as caught:
        w = ckptstore.writer(path, codec="zstd", key_layout="spread", config=TRANSFER)
    messages = [str(c.message) for c in caught]
    for old, new in (("codec", "codec"), ("key_layout", "key_layout"), ("config", "transfer")):
        assert any(f"{old}=" in m and f"WriterOptions({new}=...)" in m for m in messages)
    assert {c.filename for c in caught} == {__file__}  # the user's line, not ckptstore's
    assert (w.codec, w.key_layout, w.config) == ("zstd", "spread", TRANSFER)
    ckptstore.save(state(), w)
    written_as(path, OPTIONS)
    with pytest.warns(DeprecationWarning, match="codec="):
        ckptstore.save(state(), str(tmp_path / "step_000000002"), codec="zstd")
    written_as(str(tmp_path / "step_000000002"), WriterOptions(codec="zstd"))
    # an old keyword given with the options replaces that field, as a keyword always has
    with pytest.warns(DeprecationWarning):
        w = ckptstore.writer(str(tmp_path / "step_000000003"), OPTIONS, codec="none")
    assert (w.codec, w.key_layout) == ("none", "spread")


def test_the_reader_takes_transfer_and_config_with_a_warning(tmp_path) -> None:
    path = str(tmp_path / "step_000000001")
    ckptstore.save(state(), path, options=OPTIONS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert ckptstore.reader(path, transfer=TRANSFER).config == TRANSFER
    with pytest.warns(DeprecationWarning, match="config=.*pass transfer= instead"):
        r = ckptstore.reader(path, config=TRANSFER)
    assert r.config == TRANSFER
    out = {"w": torch.zeros(4096), "meta": {"step": 0}}
    with pytest.warns(DeprecationWarning, match="config="):
        ckptstore.load(out, path, config=TRANSFER)
    assert torch.equal(out["w"], state()["w"])


def test_writer_options_are_frozen_and_checked() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        OPTIONS.codec = "none"  # type: ignore[misc]
    with pytest.raises(TypeError, match="TransferConfig"):
        WriterOptions(transfer={"part_size": 1})  # type: ignore[arg-type]
    with pytest.raises(ckptstore.ConfigError, match="lz5"):
        ckptstore.writer("/tmp/never-written", WriterOptions(codec="lz5"))
    with pytest.raises(ckptstore.ConfigError, match="a WriterOptions, not 'zstd'"):
        ckptstore.writer("/tmp/never-written", "zstd")  # type: ignore[arg-type]
    assert ckptstore.WriterOptions is WriterOptions  # public
