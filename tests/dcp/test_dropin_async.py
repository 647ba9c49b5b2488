"""Writers and readers pickle: ``dcp.async_save`` with the process executor (which sends
the writer to a checkpointing subprocess per rank) saves through ``ckptstore.writer``,
with and without DCP's ``DefaultStager``, on 2 real gloo ranks."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

import ckptstore
from ckptstore.config import WriterOptions
from ckptstore.engine.committed import open_committed
from ckptstore.stores.local import LocalStore
from harness.dist import run_distributed

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _state(rank: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(rank)
    return {
        f"r{rank}": torch.randn(300, 50, generator=g),  # one tensor per rank
        "shared": torch.arange(1000.0),  # replicated: deduplicated onto one rank
        "step": 7,
    }


def _cpu_stager() -> Any:
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    # The CPU-safe options: pinned memory, async staging and non-blocking copies need CUDA.
    return DefaultStager(StagingOptions(False, False, False, False))


def _async_process_save(rank: int, world: int, url: str, options: dict | None, stager: bool):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    state = _state(rank)
    writer = ckptstore.writer(url, storage_options=options)
    kwargs: dict[str, Any] = {"async_checkpointer_type": AsyncCheckpointerType.PROCESS}
    if stager:
        kwargs["async_stager"] = _cpu_stager()
    result = dcp.async_save(state, storage_writer=writer, **kwargs)
    upload = getattr(result, "upload_completion", result)
    upload.result(timeout=120)
    if stager:
        kwargs["async_stager"].close()
    loaded = {k: torch.zeros_like(v) if torch.is_tensor(v) else 0 for k, v in _state(0).items()}
    loaded.update({f"r{r}": torch.zeros(300, 50) for r in range(world)})
    ckptstore.load(loaded, ckptstore.reader(url, storage_options=options))
    expected = {**_state(0), **{f"r{r}": _state(r)[f"r{r}"] for r in range(world)}}
    return all(
        torch.equal(loaded[k], v) if torch.is_tensor(v) else loaded[k] == v
        for k, v in expected.items()
    )


@pytest.mark.distributed
@pytest.mark.parametrize(
    "stager",
    [pytest.param(False, marks=pytest.mark.slow), pytest.param(True, marks=pytest.mark.slow)],
    ids=["no-stager", "default-stager"],
)
def test_async_save_process_executor_on_a_volume(tmp_path, stager: bool) -> None:
    url = str(tmp_path / "step_000000007")
    assert (
        run_distributed(_async_process_save, 2, url, None, stager, timeout=240, daemon=False)
        == [True] * 2
    )
    assert open_committed(LocalStore(url)).manifest.world_size == 2


@pytest.mark.distributed
@pytest.mark.server
@pytest.mark.slow
def test_async_save_process_executor_on_s3(seaweedfs: Any) -> None:
    from tests.conftest import BUCKET
    from tests.stores.conftest import unique

    url = f"s3://{BUCKET}/{unique('async')}/step_000000007"
    options = seaweedfs.storage_options
    assert (
        run_distributed(_async_process_save, 2, url, options, True, timeout=240, daemon=False)
        == [True] * 2
    )


def test_writer_and_reader_pickle_and_reopen_their_store(tmp_path) -> None:
    url = str(tmp_path / "step_000000001")
    w = ckptstore.writer(url, WriterOptions(codec="zstd", key_layout="spread"))
    w2 = pickle.loads(pickle.dumps(w))
    assert (w2.url, w2.codec, w2.key_layout, w2.config) == (w.url, w.codec, w.key_layout, w.config)
    assert w2.engine is w.engine  # the receiving process's shared engine for that config
    ckptstore.save({"t": torch.arange(10.0)}, w2)
    r = pickle.loads(pickle.dumps(ckptstore.reader(url)))
    out = {"t": torch.zeros(10)}
    ckptstore.load(out, r)
    assert torch.equal(out["t"], torch.arange(10.0))
