"""Single-process DCP behaviour every StorageWriter/Reader pair must show (after the
cases of PyTorch's own file-system, e2e, state_dict-helper and format_utils tests)."""

from __future__ import annotations

import io
import os
import pickle
import signal
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from tests.dcp_conformance.conftest import Backend

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    base = torch.randn(64, 48, generator=g)
    out: dict[str, torch.Tensor] = {
        "f32": base,
        "f64": base.double() * 3,
        "f16": base.half(),
        "bf16": base.bfloat16(),
        "i8": torch.randint(-128, 127, (33,), dtype=torch.int8, generator=g),
        "i64": torch.randint(-(2**62), 2**62, (17, 3), dtype=torch.int64, generator=g),
        "u8": torch.randint(0, 255, (5, 5), dtype=torch.uint8, generator=g),
        "bool": torch.rand(40, generator=g) > 0.5,
        "c64": torch.randn(9, dtype=torch.complex64, generator=g),
        "scalar": torch.tensor(3.25),
        "empty": torch.empty(0, 4),
        "transposed": base.t(),  # non-contiguous
        "strided": base[::3, 1::2],
        "large": torch.randn(3, 1 << 18, generator=g),  # 3 MiB: past small-item paths
    }
    return out


def state() -> dict:
    return {
        **tensors(),
        "nested": {"w": torch.arange(12.0).reshape(3, 4), "step": 17, "name": "run-a"},
        "lr": 0.125,
        "blob": io.BytesIO(b"\x00opaque bytes\xff"),
    }


def template() -> dict:
    t = {k: torch.zeros_like(v) for k, v in tensors().items()}
    return {
        **t,
        "nested": {"w": torch.zeros(3, 4), "step": 0, "name": ""},
        "lr": 0.0,
        "blob": io.BytesIO(),
    }


def assert_state_equal(got: dict, want: dict) -> None:
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert got[k].dtype == v.dtype, k
            assert torch.equal(got[k], v), k
        elif isinstance(v, dict):
            assert_state_equal(got[k], v)
        elif isinstance(v, io.BytesIO):
            got[k].seek(0)
            assert got[k].read() == v.getvalue(), k
        else:
            assert got[k] == v, k


def save(backend: Backend, name: str, sd: dict, **kw) -> None:
    dcp.save(sd, storage_writer=backend.writer(name, **kw), no_dist=True)


def load(backend: Backend, name: str, sd: dict) -> dict:
    dcp.load(sd, storage_reader=backend.reader(name), no_dist=True)
    return sd


def test_every_dtype_shape_and_python_value_round_trips(backend):
    save(backend, "c", state())
    assert_state_equal(load(backend, "c", template()), state())


def test_load_fills_only_the_keys_asked_for(backend):
    save(backend, "c", state())
    got = load(backend, "c", {"f64": torch.zeros(64, 48, dtype=torch.float64), "lr": 0.0})
    assert set(got) == {"f64", "lr"}
    assert torch.equal(got["f64"], state()["f64"]) and got["lr"] == 0.125


def test_loading_a_key_that_was_never_saved_fails(backend):
    save(backend, "c", {"a": torch.ones(3)})
    with pytest.raises(BaseException, match="missing|Missing|not found|b"):
        load(backend, "c", {"a": torch.zeros(3), "b": torch.zeros(3)})


def test_overwrite_replaces_the_previous_checkpoint(backend):
    save(backend, "c", {"w": torch.ones(8)})
    save(backend, "c", {"w": torch.full((8,), 2.0)}, overwrite=True)
    assert torch.equal(load(backend, "c", {"w": torch.zeros(8)})["w"], torch.full((8,), 2.0))


def test_refused_overwrite_leaves_the_first_checkpoint_loadable(backend):
    """The fsspec-overwrite case: ``overwrite=False`` into a saved checkpoint fails, and
    what was there still loads."""
    save(backend, "c", {"w": torch.ones(8)})
    with pytest.raises(BaseException):  # noqa: B017 - stock and ckptstore raise differently
        save(backend, "c", {"w": torch.full((8,), 2.0)}, overwrite=False)
    assert torch.equal(load(backend, "c", {"w": torch.zeros(8)})["w"], torch.ones(8))


def test_async_save_with_the_thread_executor(backend):
    sd = state()
    fut = dcp.async_save(sd, storage_writer=backend.writer("c"), no_dist=True)
    fut.result(timeout=120)
    assert_state_equal(load(backend, "c", template()), state())


def test_plan_caching_keeps_every_save_its_own(backend):
    """torchtitan's planner setup: later saves reuse the first plan; each checkpoint must
    still hold its own values."""
    planner = DefaultSavePlanner(enable_plan_caching=True)
    for i in range(3):
        sd = {"w": torch.full((16,), float(i)), "step": i}
        dcp.save(sd, storage_writer=backend.writer(f"s{i}"), planner=planner, no_dist=True)
    for i in range(3):
        got = load(backend, f"s{i}", {"w": torch.zeros(16), "step": -1})
        assert torch.equal(got["w"], torch.full((16,), float(i))) and got["step"] == i


CACHED_OVERWRITE = """
import pickle, sys, torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
backend = pickle.load(open(sys.argv[1], "rb"))
planner = DefaultSavePlanner(enable_plan_caching=True)
dcp.save({"w": torch.ones(4096)}, storage_writer=backend.writer("c"), planner=planner,
         no_dist=True)
# the second save (same plan, cached) dies right after its shards are durable
dcp.save({"w": torch.full((4096,), 5.0)}, storage_writer=backend.writer("c", overwrite=True),
         planner=planner, no_dist=True)
"""


@pytest.mark.processes
def test_plan_caching_overwrite_killed_after_shards_keeps_a_loadable_checkpoint(backend, tmp_path):
    """With a cached plan, an ``overwrite=True`` save killed after its shards must leave
    a checkpoint that loads whole (old or new values), never a torn mix."""
    spec = tmp_path / "backend.pkl"
    spec.write_bytes(pickle.dumps(backend))
    env = dict(os.environ, CKPTSTORE_CRASH_AT="after_shards:2")
    proc = subprocess.run(
        [sys.executable, "-c", CACHED_OVERWRITE, str(spec)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    if backend.is_ckptstore:
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = load(backend, "c", {"w": torch.zeros(4096)})["w"]
    assert torch.equal(got, torch.ones(4096)) or torch.equal(got, torch.full((4096,), 5.0))


def test_conjugate_and_negative_views_load_resolved(backend):
    x = torch.randn(6, dtype=torch.complex64, generator=torch.Generator().manual_seed(3))
    save(backend, "c", {"conj": x.conj(), "neg": x.conj().imag, "small": x[:2].conj()})
    got = load(
        backend,
        "c",
        {
            k: torch.zeros(n, dtype=d)
            for k, n, d in (
                ("conj", 6, torch.complex64),
                ("neg", 6, torch.float32),
                ("small", 2, torch.complex64),
            )
        },
    )
    assert torch.equal(got["conj"], x.conj().resolve_conj())
    assert torch.equal(got["neg"], x.conj().imag.resolve_neg())
    assert torch.equal(got["small"], x[:2].conj().resolve_conj())


def model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(11)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8, generator=g)).square().mean().backward()
        opt.step()


def test_state_dict_helpers_restore_model_and_optimizer(backend):
    model, opt = model_and_optimizer(0)
    train(model, opt, 3)
    msd, osd = get_state_dict(model, opt)
    save(backend, "c", {"model": msd, "optim": osd})
    model2, opt2 = model_and_optimizer(1)  # other weights, empty optimizer state
    train(model2, opt2, 1)
    msd2, osd2 = get_state_dict(model2, opt2)
    sd = load(backend, "c", {"model": msd2, "optim": osd2})
    set_state_dict(model2, opt2, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    train(model, opt, 2)
    train(model2, opt2, 2)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_dcp_to_torch_save_reads_the_checkpoint(backend, tmp_path):
    if not backend.is_local:
        pytest.skip("format_utils.dcp_to_torch_save takes a local directory")
    save(backend, "c", {k: v for k, v in tensors().items()})
    out = str(tmp_path / "full.pt")
    dcp_to_torch_save(backend.url("c"), out)
    full = torch.load(out, weights_only=True)
    assert_state_equal(full, tensors())


def test_torch_save_to_dcp_output_loads_through_the_reader(backend, tmp_path):
    if not backend.is_local:
        pytest.skip("format_utils.torch_save_to_dcp writes a local directory")
    src = str(tmp_path / "full.pt")
    torch.save(tensors(), src)
    torch_save_to_dcp(src, backend.url("stock"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ckptstore warns: no manifest, nothing verified
        got = load(backend, "stock", {k: torch.zeros_like(v) for k, v in tensors().items()})
    assert_state_equal(got, tensors())


def test_stock_zstd_extension_checkpoint_loads(backend):
    if not backend.is_local:
        pytest.skip("the stock writer writes a local directory")
    pytest.importorskip("zstandard")
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint._extension import ZStandard

    writer = FileSystemWriter(backend.url("z"), _extensions=[ZStandard()])
    dcp.save(tensors(), storage_writer=writer, no_dist=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = load(backend, "z", {k: torch.zeros_like(v) for k, v in tensors().items()})
    assert_state_equal(got, tensors())


def test_checkpoint_directory_holds_stock_metadata(backend):
    """Whatever else a writer adds, ``.metadata`` is there and names every key saved."""
    save(backend, "c", {"a": torch.ones(2), "b": {"c": torch.zeros(3)}})
    md = backend.reader("c").read_metadata()
    assert {"a", "b.c"} <= set(md.state_dict_metadata)
    if backend.is_local:
        assert os.path.exists(os.path.join(backend.url("c"), ".metadata"))
