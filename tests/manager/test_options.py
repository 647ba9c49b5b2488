"""``ManagerOptions``: one checked value for every manager option, built once.

Each bad value is refused when the options are made (before any store is opened), an
unknown keyword names the known ones, and a renamed keyword still works for one minor
version with a DeprecationWarning naming its new name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

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


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [("staging_dir", "local_tier_dir", "/nvme/ckpt"), ("remote_every", "root_every", 5)],
)
def test_an_old_keyword_still_works_and_warns_naming_the_new_one(old, new, value) -> None:
    """For one minor version an old keyword is its new one, with a DeprecationWarning;
    given beside the new one it is refused."""
    with pytest.warns(
        DeprecationWarning, match=f"keyword {old}= is deprecated .* pass {new}="
    ) as caught:
        options = ManagerOptions.from_keywords(**{old: value})
    assert getattr(options, new) == value and len(caught) == 1
    with pytest.raises(ConfigError, match=f"pass {new}=... alone: '{old}' is its old name"):
        ManagerOptions.from_keywords(**{old: value, new: value})


def test_remote_every_still_works_on_the_options_value() -> None:
    with pytest.warns(
        DeprecationWarning, match="keyword remote_every= is deprecated .* pass root_every="
    ) as w:
        options = ManagerOptions(remote_every=4)
    assert options.root_every == 4 and w[0].filename == __file__
    assert "remote_every" not in {f.name for f in dataclasses.fields(ManagerOptions)}


def test_an_old_keyword_reaches_the_manager(tmp_path) -> None:
    tier = tmp_path / "nvme"
    renamed = "keyword staging_dir= is deprecated .* pass local_tier_dir="
    with pytest.warns(DeprecationWarning, match=renamed) as w:
        mgr = CheckpointManager(str(tmp_path / "root"), staging_dir=str(tier), async_save=False)
    assert w[0].filename == __file__  # the warning points at the caller's line
    with mgr:
        assert mgr.options.local_tier_dir == str(tier)
        mgr.save(1, {"w": torch.ones(2)})
    assert any(tier.iterdir())  # the tier copy is where the old keyword said


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
