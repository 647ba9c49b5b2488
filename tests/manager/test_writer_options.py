"""``ManagerOptions.writer``: a ``WriterOptions`` given once reaches the writer of each save
backend (thread and process), and the old keywords (``codec=``, ``key_layout=``,
``config=``) still work, to ``ManagerOptions``, ``from_keywords`` and the manager alike."""

import pickle

import pytest
import torch

from ckptstore.config import RetryConfig, TransferConfig, WriterOptions
from ckptstore.dcp.writer import shard_prefix
from ckptstore.engine.catalog import step_name
from ckptstore.engine.committed import open_committed
from ckptstore.manager import CheckpointManager
from ckptstore.manager.options import ManagerOptions, SaveOptions
from ckptstore.manager.saving.writer_protocol import WriterSettings
from ckptstore.stores.local import LocalStore

TRANSFER = TransferConfig(part_size=1 << 20, concurrency=3, retry=RetryConfig(attempts=2))
OPTIONS = WriterOptions(codec="zstd", key_layout="spread", transfer=TRANSFER)


def test_old_keywords_warn_naming_the_new_spelling_and_land_in_writer() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        opts = ManagerOptions(codec="zstd", key_layout="spread", config=TRANSFER)  # type: ignore[call-arg]
    assert sorted(str(c.message).split(": pass ")[1] for c in caught) == [
        "writer=WriterOptions(codec=...) instead",
        "writer=WriterOptions(key_layout=...) instead",
        "writer=WriterOptions(transfer=...) instead",
    ]
    assert opts.writer == OPTIONS
    with pytest.warns(DeprecationWarning, match=r"config=.*WriterOptions\(transfer=\.\.\.\)"):
        again = ManagerOptions.from_keywords(ManagerOptions(writer=OPTIONS), config=None)
    assert again.writer == OPTIONS  # None: not given, as before
    with pytest.warns(DeprecationWarning, match="key_layout="):
        flat = ManagerOptions.from_keywords(opts, key_layout="flat")
    assert flat.writer == WriterOptions(codec="zstd", key_layout="flat", transfer=TRANSFER)


def test_a_manager_given_the_old_keywords_warns_and_saves_with_them(tmp_path) -> None:
    root = str(tmp_path / "root")
    with pytest.warns(DeprecationWarning) as caught:
        mgr = CheckpointManager(root, codec="zstd", key_layout="spread", background="thread")
    assert {c.filename for c in caught} == {__file__}  # the user's line
    with mgr:
        assert mgr.options.writer == WriterOptions(codec="zstd", key_layout="spread")
        mgr.save(1, {"w": torch.ones(64)})
    assert open_committed(LocalStore(root).child(step_name(1))).manifest.codec == "zstd"


def test_the_options_a_writer_process_gets_pickle_with_the_writer_options_whole() -> None:
    save = SaveOptions.of(ManagerOptions(writer=OPTIONS))
    assert save.writer is OPTIONS
    settings = pickle.loads(pickle.dumps(WriterSettings(root="/r", options=save)))
    assert settings.options.writer == OPTIONS


@pytest.mark.parametrize(
    "background", ["thread", pytest.param("process", marks=pytest.mark.processes)]
)
def test_writer_options_given_once_reach_the_writer(tmp_path, background: str) -> None:
    root = str(tmp_path / "root")
    with CheckpointManager(root, writer=OPTIONS, background=background) as mgr:
        assert mgr.engine.config == TRANSFER  # the manager's engine: the thread's, restores'
        mgr.save(1, {"w": torch.arange(1000, dtype=torch.float32), "n": 3})
        mgr.wait()
        assert mgr.background[0] == background
    manifest = open_committed(LocalStore(root).child(step_name(1))).manifest
    assert manifest.codec == "zstd"
    shards = [name for name in manifest.files if name.endswith(".distcp")]
    assert shards and all(n.startswith(shard_prefix(0, "spread")) for n in shards)
