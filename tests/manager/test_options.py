"""``ManagerOptions``: one checked value for every manager option, built once.

Each bad value is refused when the options are made (before any store is opened), an
unknown keyword names the known ones, and a renamed keyword names its new name.
"""

from __future__ import annotations

import dataclasses

import pytest

from ckptstore.config import WriterOptions
from ckptstore.errors import ConfigError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.options import ManagerOptions
from ckptstore.manager.retention import KeepAll, KeepLast


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"on_busy": "queue"}, "on_busy must be 'wait' or 'skip'"),
        ({"background": "fork"}, "background must be 'thread', 'process' or 'auto'"),
        ({"writer": WriterOptions(codec="lz5")}, "lz5"),
        (
            {"writer": WriterOptions(key_layout="deep")},
            "key_layout must be one of 'flat', 'spread'",
        ),
        ({"writer": {"codec": "zstd"}}, "writer must be a WriterOptions"),
        ({"max_staging_bytes": 0}, "max_staging_bytes must be a positive number"),
        ({"max_staging_bytes": True}, "max_staging_bytes must be a positive number"),
        ({"replicas": -1}, "replicas must be a whole number >= 0"),
        ({"replica_rate": 0}, "replica_rate must be a positive number of bytes/s"),
        ({"tier_limit": 1.5}, "tier_limit must be a positive number of bytes"),
        ({"grace_period_s": -1}, "grace_period_s must be a positive number"),
    ],
)
def test_a_bad_value_is_refused_when_the_options_are_made(keywords, message) -> None:
    with pytest.raises(ConfigError, match=message):
        ManagerOptions(**keywords)
    with pytest.raises(ConfigError, match=message):
        ManagerOptions.from_keywords(**keywords)


def test_an_old_keyword_names_the_new_one(tmp_path) -> None:
    with pytest.raises(ConfigError, match="'staging_dir' is now called 'local_tier_dir'"):
        CheckpointManager(str(tmp_path / "root"), staging_dir=str(tmp_path / "nvme"))
    assert not (tmp_path / "root").exists()  # refused before anything was made


def test_an_unknown_keyword_lists_the_options(tmp_path) -> None:
    with pytest.raises(ConfigError, match="unknown CheckpointManager option 'keep_last'.*keep"):
        CheckpointManager(str(tmp_path / "root"), keep_last=3)


def test_keywords_replace_fields_of_the_options_given(tmp_path) -> None:
    base = ManagerOptions(keep=KeepAll(), writer=WriterOptions(codec="zstd"), async_save=False)
    with CheckpointManager(str(tmp_path / "root"), base, writer=WriterOptions()) as mgr:
        assert mgr.options == dataclasses.replace(base, writer=WriterOptions())
        assert isinstance(mgr.options.keep, KeepAll)
    assert base.writer.codec == "zstd"  # the caller's value is not changed


def test_options_are_frozen_and_default_to_keep_last_3() -> None:
    opts = ManagerOptions(keep=None)  # type: ignore[arg-type]  # None means the default
    assert opts.keep == KeepLast(3) and ManagerOptions().keep == KeepLast(3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.writer = WriterOptions()  # type: ignore[misc]
