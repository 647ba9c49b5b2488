"""The URL -> store registry: built-in table, the ``ckptstore.stores`` entry-point group
(real distributions on ``sys.path``), ``local://`` and the one constructor signature."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ckptstore.errors import ConfigError, MissingDependencyError
from ckptstore.stores import (
    BUILTIN_STORES,
    ENTRY_POINT_GROUP,
    open_store,
    store_spec,
)
from ckptstore.stores.local import LocalStore
from ckptstore.tier.jobs import check_local_tier_dir

from .conftest import unique

#: A third-party store package: a Store subclass of primitives only (conformance-tested
#: in test_conformance.py), importable from a throwaway site directory.
STORE_MODULE = """
from tests.stores.test_conformance import MinimalStore

class ThirdPartyStore(MinimalStore):
    pass

class NotAStore:
    def __init__(self, *args, **kwargs):
        pass
"""


def install_dist(site: Path, dist: str, entry_points: dict[str, str], module: str = "") -> None:
    """A distribution ``dist`` in ``site`` as pip would leave it: a dist-info with METADATA
    and entry_points.txt (group ckptstore.stores), plus its module if given."""
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = [f"[{ENTRY_POINT_GROUP}]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    if module:
        (site / f"{dist.replace('-', '_')}.py").write_text(module)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site directory on ``sys.path`` for the test's distributions."""
    d = tmp_path / "site"
    d.mkdir()
    monkeypatch.syspath_prepend(str(d))
    return d


def test_a_third_party_store_registers_with_one_entry_point(site: Path) -> None:
    install_dist(site, "ckpt-thirdparty", {"tp": "ckpt_thirdparty:ThirdPartyStore"}, STORE_MODULE)
    spec = store_spec("tp")
    assert spec is not None and spec.distribution == "ckpt-thirdparty"
    store = open_store(f"tp://{unique()}/root", {"opt": 1})
    assert type(store).__name__ == "ThirdPartyStore"
    assert store.storage_options == {"opt": 1}  # built like every store
    store.put("a/b", b"x")
    assert store.find() == ["a/b"] and store.child("a").get("b") == b"x"
    assert open_store(f"TP://{unique()}/root").find() == []  # schemes are case-blind


def test_builtins_win_over_entry_points(site: Path) -> None:
    install_dist(site, "ckpt-hijack", {"s3": "ckpt_hijack:ThirdPartyStore"}, STORE_MODULE)
    spec = store_spec("s3")
    assert spec is not None and spec.target == "ckptstore.stores.s3:S3Store"
    assert spec.distribution is None


def test_an_entry_point_that_cannot_be_imported_names_its_distribution(site: Path) -> None:
    install_dist(site, "ckpt-broken", {"broken": "ckpt_broken_missing:Store"})
    with pytest.raises(MissingDependencyError, match="ckpt-broken") as info:
        open_store("broken://x/y")
    assert "ckpt_broken_missing" in str(info.value)


def test_an_entry_point_naming_no_store_is_a_config_error(site: Path) -> None:
    install_dist(site, "ckpt-wrong", {"wrong": "ckpt_wrong:NotAStore"}, STORE_MODULE)
    with pytest.raises(ConfigError, match=r"ckpt-wrong.*not a ckptstore.engine.store.Store"):
        open_store("wrong://x/y")
    install_dist(site, "ckpt-noattr", {"noattr": "ckpt_noattr:Nothing"}, STORE_MODULE)
    with pytest.raises(ConfigError, match="ckpt-noattr"):
        open_store("noattr://x/y")
    install_dist(site, "ckpt-novalue", {"novalue": "ckpt_novalue"}, STORE_MODULE)
    with pytest.raises(ConfigError, match="not 'module:Class'"):
        open_store("novalue://x/y")


def test_two_distributions_for_one_scheme_are_refused(site: Path) -> None:
    install_dist(site, "ckpt-one", {"dup": "ckpt_one:ThirdPartyStore"}, STORE_MODULE)
    install_dist(site, "ckpt-two", {"dup": "ckpt_two:ThirdPartyStore"}, STORE_MODULE)
    with pytest.raises(ConfigError, match=r"several.*ckpt-(one|two).*ckpt-(one|two)"):
        open_store("dup://x/y")


def test_local_scheme_is_stripped(tmp_path: Path) -> None:
    for url in (f"local://{tmp_path}/x", f"LOCAL://{tmp_path}/x", f"file://{tmp_path}/x"):
        store = open_store(url)
        assert isinstance(store, LocalStore) and store.url == f"{tmp_path}/x"
        store.put("f", b"1")
    assert (tmp_path / "x" / "f").read_bytes() == b"1"
    assert open_store("local:///tmp/x").url == "/tmp/x"
    assert LocalStore("local:///tmp/x").child("s").url == "/tmp/x/s"
    with pytest.raises(ConfigError, match="do not apply to a local path"):
        open_store(f"local://{tmp_path}", {"key": "k"})


def test_staging_inside_a_local_url_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with pytest.raises(ConfigError, match="inside the checkpoint root"):
        check_local_tier_dir(f"local://{root}", str(root / "staging"))
    check_local_tier_dir(f"local://{root}", str(tmp_path / "staging"))  # beside it: fine


def test_every_builtin_store_takes_the_one_constructor() -> None:
    import inspect

    for spec in BUILTIN_STORES:
        params = inspect.signature(spec.load()).parameters
        assert list(params)[:2] == ["url", "storage_options"], spec.target
        assert params["storage_options"].default is None
        assert params["retry"].kind is inspect.Parameter.KEYWORD_ONLY
        assert params["retry"].default is None


def test_entry_points_are_read_afresh(site: Path) -> None:
    """No cache: a distribution installed (or removed) meanwhile is seen on the next open."""
    assert store_spec("once") is None
    install_dist(site, "ckpt-once", {"once": "ckpt_once:ThirdPartyStore"}, STORE_MODULE)
    assert store_spec("once") is not None
    sys.path.remove(str(site))
    assert store_spec("once") is None
