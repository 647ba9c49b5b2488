"""The faults ckptstore's stores survive, met through CkptStoreStorage: wrong credentials
(refused at once, no secret in the message), a missing object, a truncated object, and a
rename whose copies fail midway (nothing half-renamed: the source whole, no copy left), or
fail once (retried); and a renamed directory's metadata.pkl lands last."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from torch_checkpointing.storage.base_storage import ReadArgs

from ckptstore.errors import CorruptCheckpointError, StoreAccessError, TransientStoreError
from ckptstore.testing.faults import Fault, FaultyStore
from ckptstore_tc import CkptStoreStorageConfig
from harness.azurite import ACCOUNT_KEY
from tests.conftest import BUCKET

M = Path("/ckpt")
SECRET = "n0t-the-s3cret-2f9c"


@pytest.fixture
def env(tc_root):
    url, options, store = tc_root
    storage = CkptStoreStorageConfig(url, mount=str(M), storage_options=options).create_storage()
    return storage, store


@pytest.mark.server
def test_wrong_s3_credentials_are_refused_without_the_secret(seaweedfs) -> None:
    options = dict(seaweedfs.storage_options, secret=SECRET)
    storage = CkptStoreStorageConfig(f"s3://{BUCKET}/tc-creds", storage_options=options)
    with pytest.raises(PermissionError) as info:
        storage.create_storage().write(Path("/x"), b"x")
    assert isinstance(info.value, StoreAccessError) and SECRET not in str(info.value)


@pytest.mark.server
def test_a_wrong_azure_key_is_refused_without_the_key(azurite_server) -> None:
    azurite_server.create_bucket("tc-creds")
    wrong = ACCOUNT_KEY[:-8] + "AAAAAAA="
    options = {"connection_string": azurite_server.connection_string(account_key=wrong)}
    storage = CkptStoreStorageConfig("az://tc-creds/root", storage_options=options)
    with pytest.raises(PermissionError) as info:
        storage.create_storage().write(Path("/x"), b"x")
    assert wrong not in str(info.value)


def test_a_missing_object_is_file_not_found(env) -> None:
    storage, _ = env
    for op in (
        lambda: storage.read(M / "absent"),
        lambda: storage.stream_read(M / "absent", ReadArgs(pre_read_full_file=False)),
        lambda: storage.getsize(M / "absent"),
        lambda: storage.delete(M / "absent"),
    ):
        with pytest.raises(FileNotFoundError):
            op()


def test_a_truncated_object_is_refused(env) -> None:
    storage, store = env
    data = os.urandom(3 * 2**20)
    store.put("f", data)
    with storage.stream_read(M / "f", ReadArgs(pre_read_full_file=False)) as f:
        store.put("f", data[: 2**20])  # cut short under the open reader
        with pytest.raises(CorruptCheckpointError, match="truncated"):
            f.readinto(bytearray(len(data)))


def _populate(storage, n: int = 6) -> dict[str, bytes]:
    files = {f"shard_{i}.pt": os.urandom(1000 + i) for i in range(n)}
    storage.mkdir(M / "tmp_step")
    for name, data in files.items():
        storage.write(M / "tmp_step" / name, data)
    return files


def test_a_rename_failing_midway_leaves_nothing_half_renamed(env) -> None:
    storage, store = env
    if storage._volume is not None:
        pytest.skip("a volume renames with one os.rename: there is no midway")
    files = _populate(storage)
    storage.store = FaultyStore(store, [Fault("copy", calls={4}, error=StoreAccessError("no"))])
    with pytest.raises(StoreAccessError):
        storage.rename(M / "tmp_step", M / "step", is_directory=True)
    assert {n: store.get(f"tmp_step/{n}") for n in files} == files  # the source is whole
    assert store.find("step") == []  # and no copy is left


def test_a_copy_failing_once_is_retried(env) -> None:
    storage, store = env
    if storage._volume is not None:
        pytest.skip("a volume renames with one os.rename: nothing is copied")
    files = _populate(storage)
    flaky = Fault("copy", calls={2}, error=TransientStoreError("injected 503"))
    storage.store = faulty = FaultyStore(store, [flaky])
    storage.rename(M / "tmp_step", M / "step", is_directory=True)
    assert {n: store.get(f"step/{n}") for n in files} == files
    assert store.find("tmp_step") == [] and faulty.calls["copy"] == len(files) + 1


def test_the_metadata_lands_after_every_other_file(env) -> None:
    storage, store = env
    if storage._volume is not None:
        pytest.skip("a volume renames with one os.rename: nothing is copied")
    files = _populate(storage)
    storage.write(M / "tmp_step/metadata.pkl", b"global metadata")
    landed: list[str] = []

    class Recording(FaultyStore):
        def copy(self, src: str, dst: str) -> None:
            super().copy(src, dst)
            landed.append(dst)

    storage.store = Recording(store)
    storage.rename(M / "tmp_step", M / "step", is_directory=True)
    assert landed[-1] == "step/metadata.pkl" and len(landed) == len(files) + 1
