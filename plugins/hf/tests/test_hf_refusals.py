"""What the Hugging Face plugin refuses, and how: framework versions, a folder the ranks
see with different bytes."""

from __future__ import annotations

import pytest

from ckptstore.errors import ConfigError, check_version, require_version
from ckptstore_hf import _versions
from ckptstore_hf._folder import _shares


@pytest.mark.parametrize(
    "name, version",
    [
        ("transformers", "4.39.3"),
        ("transformers", "6.0.0"),
        ("accelerate", "0.29.0"),
        ("accelerate", "not-a-version"),
    ],
)
def test_a_framework_version_outside_the_range_names_the_range(name, version) -> None:
    spec = _versions.SUPPORTED[name]
    with pytest.raises(ConfigError) as info:
        check_version(name, version, spec, _versions.EXTRA)
    msg = str(info.value)
    assert f"{name}{spec}" in msg and version in msg and "ckptstore[hf]" in msg


def test_the_installed_frameworks_are_in_range() -> None:
    for name, spec in _versions.SUPPORTED.items():
        pytest.importorskip(name)
        require_version(name, spec, _versions.EXTRA)  # raises if not


def test_folder_shares_balance_bytes_and_refuse_different_copies() -> None:
    # One shared file system: both ranks see everything; each file goes to one rank.
    same = {"model.safetensors": 100, "optimizer.pt": 60, "a.json": 10, "b.json": 10}
    sizes, owner = _shares([same, dict(same)])
    assert sizes == same
    assert owner == {"model.safetensors": 0, "optimizer.pt": 1, "a.json": 1, "b.json": 1}
    # Node-local disks: a file only one rank sees is that rank's.
    sizes, owner = _shares([{"model.safetensors": 100, "rng_0": 5}, {"rng_1": 5}])
    assert owner == {"model.safetensors": 0, "rng_0": 0, "rng_1": 1}
    with pytest.raises(ConfigError, match="rank 0 sees 'x' with 1 bytes and rank 1 with 2"):
        _shares([{"x": 1}, {"x": 2}])
