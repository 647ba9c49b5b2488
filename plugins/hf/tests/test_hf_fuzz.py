"""Fuzz the Hugging Face plugin's parsers of bytes read back from storage.

``parse_index`` (a folder index) and ``name_below`` (a local path an index names) may only
return what they document or raise a ``CorruptCheckpointError``; nothing they accept can
name a file outside its folder (a link on the way is the act's to refuse: see
test_hf_swap_race.py). Seeded with the crafted inputs of test_hf_untrusted.py
(hf_inputs.py).
"""

from __future__ import annotations

import json
import os

from hf_inputs import MALFORMED_INDEXES
from hypothesis import example, given
from hypothesis import strategies as st

from ckptstore.errors import CorruptCheckpointError
from ckptstore.stores import is_safe_name
from ckptstore_hf._folder_index import parse_index
from ckptstore_hf._local import name_below
from tests.plugins.fuzzing import SETTINGS, json_values, seeded

_json = json_values

_rel = st.text(st.sampled_from("ab./\\\x00"), min_size=0, max_size=8)
_entry = st.fixed_dictionaries(
    {"size": st.integers(-2, 2**60) | _json, "crc32c": st.integers(-1, 2**40) | _json}
)
_index_doc = st.fixed_dictionaries(
    {
        "format": st.just("ckptstore.folder") | _json,
        "version": st.just(1) | _json,
        "name": st.sampled_from(["checkpoint-2", "../x", "..", "x_2", ".h_2"]) | _json,
        "path": st.sampled_from(["/o/checkpoint-2", "o/checkpoint-2", "/o/../checkpoint-2"])
        | _json,
        "files": st.dictionaries(_rel, _entry | _json, max_size=4) | _json,
    },
    optional={"extra": _json},
)
_index_bytes = st.binary(max_size=300) | _index_doc.map(lambda d: json.dumps(d).encode())


def _index_seed(value: object) -> bytes:
    return value if isinstance(value, bytes) else json.dumps(value).encode()


@SETTINGS
@given(_index_bytes)
@seeded([_index_seed(index) for index, _files in MALFORMED_INDEXES.values()])
def test_parse_index_accepts_only_names_that_stay_inside(data: bytes) -> None:
    try:
        index = parse_index(data, 2)
    except CorruptCheckpointError:
        return
    name = index["name"]
    assert is_safe_name(name) and "/" not in name and not name.startswith(".")
    assert os.path.isabs(index["path"]) and os.path.basename(index["path"]) == name
    for rel, want in index["files"].items():
        assert is_safe_name(rel)
        assert type(want["size"]) is int and want["size"] >= 0
        assert type(want["crc32c"]) is int and 0 <= want["crc32c"] < 2**32


_path = st.text(st.sampled_from("ab./\x00"), max_size=12)


@SETTINGS
@given(_path)
@example("../x")
@example("/etc/passwd")
@example("a/../../x")
@example("")
@example("link/x")
def test_name_below_keeps_every_accepted_path_below_the_base(tmp_path, path: str) -> None:
    base = str(tmp_path / "base")
    try:
        got = name_below(path if os.path.isabs(path) else os.path.join(base, path), base)
    except CorruptCheckpointError:
        return
    assert is_safe_name(got)  # relative, normalised: no '..', no empty segment, not base
    assert os.path.normpath(os.path.join(base, got)) == os.path.join(base, got)
