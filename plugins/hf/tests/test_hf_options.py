"""The Trainer callback and the Accelerate hooks take the manager's options as
``CheckpointManager`` does (one ``ManagerOptions``, or its fields as keywords), so every
option reaches the manager they make, a new one with no edit here, and a wrong or renamed
keyword is refused the same way, when the plugin is made."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from ckptstore import ManagerOptions  # noqa: E402
from ckptstore.errors import ConfigError  # noqa: E402
from ckptstore_hf import CkptStoreAccelerate, CkptStoreCallback, _folder  # noqa: E402
from tests.plugins.util import (  # noqa: E402
    CADENCES,
    ManagerSpy,
    assert_refuses_wrong_options,
    every_manager_option,
)

PLUGINS = [CkptStoreCallback, CkptStoreAccelerate]


@pytest.mark.parametrize("how", ["keywords", "options"])
@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.__name__)
def test_every_manager_option_reaches_the_manager(tmp_path, monkeypatch, plugin, how) -> None:
    monkeypatch.setattr(_folder, "CheckpointManager", ManagerSpy)
    values = every_manager_option(tmp_path)
    root = str(tmp_path / "root")
    for name in CADENCES:  # refused: the trainer decides when to save
        with pytest.raises(ConfigError, match=name):
            plugin(root, **{name: values[name]})
        values[name] = getattr(ManagerOptions(), name)
    ckpt = plugin(root, **values) if how == "keywords" else plugin(root, ManagerOptions(**values))
    mgr = ckpt.folders.manager
    assert isinstance(mgr, ManagerSpy) and mgr.root == root
    for field in dataclasses.fields(ManagerOptions):
        assert getattr(mgr.options, field.name) == values[field.name], field.name


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.__name__)
def test_wrong_options_are_refused_at_once_as_the_manager_refuses_them(tmp_path, plugin):
    assert_refuses_wrong_options(lambda **keywords: plugin(str(tmp_path / "root"), **keywords))
