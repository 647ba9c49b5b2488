"""``--storage-option`` parsing and which URL gets which options."""

from __future__ import annotations

import pytest

from ckptstore.cli.context import Context, merge_options, parse_storage_options, split_file_url
from ckptstore.errors import ConfigError


def test_storage_option_parsing() -> None:
    got = parse_storage_options(
        ["anon=true", "client_kwargs.endpoint_url=http://127.0.0.1:8333", "n=8", 'key="123"']
    )
    assert got == {
        "anon": True,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:8333"},
        "n": 8,
        "key": "123",
    }
    assert merge_options({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}
    for bad in (["novalue"], ["=x"], ["a=1", "a.b=2"]):
        with pytest.raises(ConfigError):
            parse_storage_options(bad)


def test_shared_options_skip_local_paths() -> None:
    ctx = Context(options={"anon": True}, side_options={"dst": {"x": 1}})
    assert ctx.options_for("/tmp/a") == {}
    assert ctx.options_for("s3://b/k") == {"anon": True}
    assert ctx.options_for("s3://b/k", "dst") == {"anon": True, "x": 1}
    assert split_file_url("s3://b/dir/m.pt") == ("s3://b/dir", "m.pt")
    with pytest.raises(ConfigError):
        split_file_url("s3://bucket")
