"""``.metadata`` across torch releases: torch 2.15's ``TensorProperties.strides`` (a sixth
pickled field) is read on every supported torch and checked; ckptstore writes the oldest
layout that loses nothing; what a newer torch wrote and this one cannot read is
``NewerFormatError`` (naming both releases), never ``CorruptCheckpointError``. The bytes
of each layout are made here on any torch (:func:`pickled`), so every release runs every
test; ``tests/compat`` reads real checkpoints of each release."""

from __future__ import annotations

import copyreg
import io
import pickle
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.metadata import TensorProperties

import ckptstore
from ckptstore.dcp.metadata import dump_metadata, load_metadata
from ckptstore.errors import CorruptCheckpointError, NewerFormatError


def _metadata(tmp_path, state: dict[str, Any]) -> Any:
    ckptstore.save(state, str(tmp_path / "ck"))
    return load_metadata((tmp_path / "ck" / ".metadata").read_bytes(), "ck/.metadata")


def pickled(md: Any, extra: dict[str, tuple]) -> bytes:
    """``md`` pickled with the tensor properties of each item named in ``extra`` written
    as torch 2.13's five fields plus ``extra[item]`` (``(strides,)``: torch 2.15's layout)."""
    props = {id(m.properties): extra[k] for k, m in md.state_dict_metadata.items() if k in extra}

    def reduce(p: TensorProperties) -> Any:
        state = p.__getstate__()[:5] + props.get(id(p), ())  # type: ignore[attr-defined]
        return copyreg.__newobj__, (TensorProperties,), state  # type: ignore[attr-defined]

    buf = io.BytesIO()
    pickler = pickle.Pickler(buf)
    pickler.dispatch_table = {**copyreg.dispatch_table, TensorProperties: reduce}
    pickler.dump(md)
    return buf.getvalue()


class _Fields(TensorProperties):
    """Records how many fields each pickled ``TensorProperties`` had."""

    seen: list[int] = []

    def __setstate__(self, state: Any) -> None:
        _Fields.seen.append(len(state))


class _Counting(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name == "TensorProperties":
            return _Fields
        return super().find_class(module, name)


def _fields_written(data: bytes) -> list[int]:
    _Fields.seen = []
    _Counting(io.BytesIO(data)).load()
    return _Fields.seen


STATE = {"w": torch.ones(2, 3), "s": torch.tensor(1.0), "n": 5}


def test_the_2_15_layout_loads_with_its_strides_checked(tmp_path) -> None:
    md = _metadata(tmp_path, STATE)
    data = pickled(md, {"w": ((3, 1),), "s": ((),)})
    got = load_metadata(data, "x")
    assert got.state_dict_metadata["w"].properties.strides == (3, 1)
    assert got.state_dict_metadata["s"].properties.strides == ()
    assert type(got.state_dict_metadata["w"].properties) is TensorProperties


@pytest.mark.parametrize(
    "strides, match",
    [
        ((3,), "strides"),  # one per dimension of the item: (2, 3) has two
        ((3, 1, 1), "strides"),
        ((3, -1), "strides"),
        ([3, 1], "strides"),
        (("3", 1), "strides"),
        ((3.0, 1), "strides"),
        ((1 << 64, 1), "strides"),
        ((True, 1), "strides"),
    ],
)
def test_malformed_strides_are_corrupt(tmp_path, strides: Any, match: str) -> None:
    md = _metadata(tmp_path, STATE)
    with pytest.raises(CorruptCheckpointError, match=match):
        load_metadata(pickled(md, {"w": (strides,)}), "x")


def test_a_seventh_field_is_corrupt_unless_a_newer_torch_wrote_it(tmp_path) -> None:
    md = _metadata(tmp_path, STATE)
    data = pickled(md, {"w": ((3, 1), "a field of torch 9.1")})
    with pytest.raises(CorruptCheckpointError):
        load_metadata(data, "x", written_by=torch.__version__)
    with pytest.raises(NewerFormatError) as info:
        load_metadata(data, "ck/.metadata", written_by="9.1.0+cu200")
    message = str(info.value)
    assert "torch 9.1.0+cu200" in message and f"this torch is {torch.__version__}" in message
    assert "torch>=9.1" in message and "ckptstore-tool convert" in message
    assert not isinstance(info.value, CorruptCheckpointError)


def test_a_hostile_writer_version_is_quoted(tmp_path) -> None:
    md = _metadata(tmp_path, STATE)
    data = pickled(md, {"w": ((3, 1), "x")})
    with pytest.raises(NewerFormatError) as info:
        load_metadata(data, "x", written_by="99.0\x1b[2J" + "9" * 100)
    assert "\x1b" not in str(info.value) and "9" * 60 not in str(info.value)


def test_ckptstore_writes_the_oldest_layout_that_loses_nothing(tmp_path) -> None:
    md = _metadata(tmp_path, {"w": torch.ones(2, 3), "t": torch.ones(3, 2), "n": 5})
    data = pickled(md, {"w": ((3, 1),), "t": ((1, 3),)})  # t: a transposed tensor's
    md = load_metadata(data, "x")
    written = _fields_written(dump_metadata(md))
    if hasattr(TensorProperties(), "strides"):  # torch >= 2.15 keeps them: t's are not lost
        assert sorted(written) == [5, 6]
    else:  # this torch has no field for them: five, as it always writes
        assert written == [5, 5]
    assert (
        load_metadata(dump_metadata(md), "x").state_dict_metadata.keys()
        == md.state_dict_metadata.keys()
    )


def test_a_saved_checkpoint_is_in_the_oldest_layout(tmp_path) -> None:
    ckptstore.save({"w": torch.ones(2, 3), "c": torch.ones(1, 3, 2, 2)}, str(tmp_path / "ck"))
    assert _fields_written((tmp_path / "ck" / ".metadata").read_bytes()) == [5, 5]
