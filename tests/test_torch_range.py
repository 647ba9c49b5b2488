"""ckptstore's torch range: every private torch name it relies on is still where it imports
it from, every such import in the code is listed below with its guard, and pyproject
declares exactly the torch releases that were tested (``make test-torch TORCH=...``).

``PRIVATE`` is the list docs/ARCHITECTURE.md prints. A guard is what a user sees if a torch
release moves the name: ``TorchVersionError`` (``ckptstore.errors.torch_name``: it names
the name, the installed torch and the tested range), or a fallback that keeps working.
When a test here fails on a new torch, fix the import it names and its row below.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import NamedTuple

import pytest
import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ckptstore.errors import TORCH_RANGE, TorchVersionError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The torch releases the DCP, manager, CLI and conformance suites passed on (the README's
#: compatibility table); pyproject's range is exactly the minors they span.
TESTED = ("2.13.0", "2.14.1", "2.15.0")


class Private(NamedTuple):
    module: str  # where torch defines it
    name: str  # a dotted path: an attribute of an attribute is checked all the way down
    users: str  # the ckptstore modules that use it
    guard: str  # what happens if it moves


_AT_IMPORT = "TorchVersionError when the module is imported"
_WHEN_USED = "TorchVersionError when first used"
_TORCH_LOAD = "a stored tensor decodes through torch.load (a copy), not as a view of its bytes"
_CRC32 = "items are written by torch.save (a zip CRC-32 over every byte, GIL held): slower"
_DCP = "torch.distributed.checkpoint"
_C10D = "torch.distributed.distributed_c10d"

PRIVATE = [
    Private(
        f"{_DCP}.filesystem",
        "_StorageInfo",
        "dcp/metadata_checks.py (as StorageInfo, for dcp/metadata.py, indexes.py, transcode.py)",
        _AT_IMPORT,
    ),
    Private(f"{_DCP}.metadata", "_MEM_FORMAT_ENCODING", "dcp/metadata.py", _AT_IMPORT),
    Private(
        f"{_DCP}.state_dict_saver",
        "_save_state_dict",
        "dcp/save_load.py",
        "falls back to the stock dcp.save (which warns without a process group)",
    ),
    Private(
        f"{_DCP}.state_dict_saver",
        "_stateful_to_state_dict",
        "dcp/save_load.py",
        "falls back to the stock dcp.save",
    ),
    Private(
        f"{_DCP}.state_dict_loader",
        "_load_state_dict",
        "dcp/save_load.py; cli/sources.py; harness/ckptcheck.py (dev only)",
        "save_load: falls back to the stock dcp.load; cli: " + _WHEN_USED,
    ),
    Private(f"{_DCP}._nested_dict", "set_element", "cli/safeload.py", _AT_IMPORT),
    Private(f"{_DCP}._nested_dict", "flatten_state_dict", "cli/sources.py", _WHEN_USED),
    Private(
        f"{_DCP}.default_planner",
        "_EmptyStateDictLoadPlanner",
        "cli/safeload.py; harness/ckptcheck.py (dev only)",
        _AT_IMPORT,
    ),
    Private(
        "torch.storage",
        "_get_dtype_from_pickle_storage_type",
        "dcp/decoding.py (decode_tensor)",
        _TORCH_LOAD,
    ),
    Private(
        "torch.cuda",
        "_pin_memory_utils.pin_memory",
        "manager/saving/host_arena.py, shared_arena.py (pinned staging only)",
        _WHEN_USED,
    ),
    Private("torch.cuda", "_pin_memory_utils.unpin_memory", "the same", "runs only after a pin"),
    Private(f"{_C10D}", "_get_default_store", "manager/saving/writer_process.py", _WHEN_USED),
    Private(
        f"{_C10D}",
        "_world.group_count",
        "launch.py (fresh_new_group under torchrun's shared store)",
        _WHEN_USED,
    ),
    Private(
        "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
        "DynamicRendezvousHandler",
        "rendezvous.py: resets its _bootstrap_store_info, _shared_tcp_store_server",
        "RendezvousVersionError (a TorchVersionError) when torchrun makes the handler",
    ),
    Private(
        "torch.serialization",
        "_save",
        "dcp/encoding.py (_save_tensor: tensor items without the zip CRC-32)",
        _CRC32,
    ),
    Private("torch.serialization", "_get_storage_alignment", "the same", _CRC32),
    Private("torch", "_C.PyTorchFileWriter", "the same", _CRC32),
    # Names in pickles ckptstore's own unpicklers resolve (the bytes hold them, the code
    # compares strings): if torch pickles under another name, the unpickler refuses it.
    Private(
        "torch._utils",
        "_rebuild_tensor_v2",
        "dcp/decoding.py (decode_tensor's unpickler)",
        _TORCH_LOAD,
    ),
    Private(
        "torch.serialization",
        "_get_layout",
        "dcp/metadata.py (.metadata pickles)",
        "CorruptCheckpointError naming the global the metadata holds",
    ),
    Private(
        f"{_DCP}._extension",
        "ZStandard",
        "engine/codecs.py writes its descriptor, stream.zstd/1, as a string (engine has no torch)",
        "stock readers refuse ckptstore's zstd items (the test below compares the two)",
    ),
    # Public, but newer than the floor pyproject declared before it was tested.
    Private(
        f"{_DCP}.staging",
        "DefaultStager",
        "manager/saving/thread_backend.py",
        "pyproject's torch floor",
    ),
    Private(f"{_DCP}.staging", "StagingOptions", "the same", "pyproject's torch floor"),
]

#: ``from torch... import _x`` (also inside parentheses), ``from torch..._mod import x``
#: and an attribute path through a private name (``dist.distributed_c10d._world``).
_FROM_IMPORT = re.compile(r"^\s*from\s+(torch[\w.]*)\s+import\s+(?:\(([^)]*)\)|([^\n#]+))", re.M)
_ATTRIBUTE = re.compile(r"\b(?:torch|dist|dcp|dcp_md)\.(?:\w+\.)*?_[a-zA-Z]\w*")
_SOURCES = ("ckptstore", "plugins", os.path.join("tools", "ckptstore-harness", "harness"))


def _resolve(module: str, name: str) -> object:
    value: object = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("entry", PRIVATE, ids=lambda e: f"{e.module}.{e.name}")
def test_every_listed_torch_name_is_where_ckptstore_imports_it(entry: Private) -> None:
    try:
        _resolve(entry.module, entry.name)
    except (ImportError, AttributeError) as exc:
        pytest.fail(
            f"torch {torch.__version__} has no {entry.module}.{entry.name} ({exc}); ckptstore's "
            f"{entry.users} use it (if it moves: {entry.guard}). Import it from where this torch "
            "keeps it, and update its row in tests/test_torch_range.py and docs/ARCHITECTURE.md"
        )


def _private_names_in_code() -> set[str]:
    """Every ``module.name`` the code imports from torch where module or name is private."""
    found: set[str] = set()
    for top in _SOURCES:
        for folder, _dirs, files in os.walk(os.path.join(REPO, top)):
            for file in (f for f in files if f.endswith(".py")):
                with open(os.path.join(folder, file), encoding="utf-8") as f:
                    text = f.read()
                for m in _FROM_IMPORT.finditer(text):
                    module, names = m.group(1), m.group(2) or m.group(3)
                    for part in re.sub(r"#.*", "", names).split(","):
                        name = part.split(" as ")[0].strip()
                        if name and ("._" in module or name.startswith("_")):
                            found.add(f"{module}.{name}")
                found.update(m.group(0) for m in _ATTRIBUTE.finditer(text))
    return found


def test_every_private_torch_name_in_the_code_is_listed() -> None:
    listed = {f"{e.module}.{e.name}" for e in PRIVATE}
    aliases = {"dist.": "torch.distributed.", "dcp_md.": f"{_DCP}.metadata.", "dcp.": f"{_DCP}."}
    missing = []
    for name in sorted(_private_names_in_code()):
        for short, full in aliases.items():
            if name.startswith(short):
                name = full + name[len(short) :]
        if not any(entry == name or entry.startswith(name + ".") for entry in listed):
            missing.append(name)
    assert not missing, (
        f"ckptstore imports private torch names not listed in PRIVATE: {missing}; add each with "
        "its guard (ckptstore.errors.torch_name around the import) here and in "
        "docs/ARCHITECTURE.md"
    )


def test_a_moved_name_fails_the_import_with_the_torch_version(monkeypatch) -> None:
    """As if a torch release dropped ``_StorageInfo``: ``import ckptstore.dcp.metadata``
    fails with a ``TorchVersionError`` naming it, this torch and the tested range."""
    filesystem = importlib.import_module(f"{_DCP}.filesystem")
    monkeypatch.delattr(filesystem, "_StorageInfo")
    monkeypatch.delitem(sys.modules, "ckptstore.dcp.metadata", raising=False)
    monkeypatch.delitem(sys.modules, "ckptstore.dcp.metadata_checks", raising=False)
    with pytest.raises(TorchVersionError) as info:
        importlib.import_module("ckptstore.dcp.metadata")
    assert isinstance(info.value, ImportError)
    message = str(info.value)
    assert "_StorageInfo" in message
    assert f"torch {torch.__version__}" in message
    assert f"pip install 'torch{TORCH_RANGE}'" in message


def test_a_moved_name_fails_its_first_use_with_the_torch_version(monkeypatch) -> None:
    from ckptstore.cli.sources import flatten

    nested = importlib.import_module(f"{_DCP}._nested_dict")
    monkeypatch.delattr(nested, "flatten_state_dict")
    with pytest.raises(TorchVersionError, match=r"flatten_state_dict.*torch 2\.\d+"):
        flatten({"a": {"b": 1}})


def test_zstd_items_carry_the_descriptor_of_torchs_zstandard() -> None:
    pytest.importorskip("zstandard")
    from torch.distributed.checkpoint._extension import ZStandard

    from ckptstore.engine.codec_registry import get_codec

    assert get_codec("zstd").dcp_transform == ZStandard().get_descriptor()


def test_pyproject_declares_the_tested_torch_range() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    spec = None
    for folder in ("", "plugins/lightning", "plugins/hf", "tools/ckptstore-harness"):
        with open(os.path.join(REPO, folder, "pyproject.toml"), "rb") as f:
            project = tomllib.load(f)["project"]
        for dep in project.get("dependencies", []):
            if re.match(r"torch\b(?![-_\w])", dep):
                assert dep == f"torch{TORCH_RANGE}", f"{folder or '.'}/pyproject.toml: {dep}"
                spec = spec or dep
    assert spec == f"torch{TORCH_RANGE}", "pyproject.toml declares no torch requirement"
    bounds = {s.operator: Version(s.version) for s in SpecifierSet(TORCH_RANGE)}
    tested = sorted(Version(v) for v in TESTED)
    assert set(bounds) == {">=", "<"}, TORCH_RANGE
    assert bounds[">="] == Version(f"{tested[0].major}.{tested[0].minor}"), (
        f"the floor of torch{TORCH_RANGE} is not the oldest tested release ({tested[0]})"
    )
    assert bounds["<"] == Version(f"{tested[-1].major}.{tested[-1].minor + 1}"), (
        f"the cap of torch{TORCH_RANGE} is not just above the newest tested release"
    )
    with open(os.path.join(REPO, "tools", "constraints.txt"), encoding="utf-8") as f:
        pinned = re.search(r"^torch==(\S+)", f.read(), re.M)
    assert pinned and pinned.group(1) in TESTED, "make setup's torch is not a tested release"


def test_the_running_torch_is_in_the_range() -> None:
    installed = Version(torch.__version__).base_version  # 2.13.0+cpu -> 2.13.0
    assert installed in SpecifierSet(TORCH_RANGE), (
        f"these tests run on torch {torch.__version__}, outside ckptstore's torch{TORCH_RANGE}"
    )


def test_the_rendezvous_handler_still_has_what_ckptstore_c10d_resets() -> None:
    """``create_handler`` raises ``RendezvousVersionError`` if torch's handler changed; here
    it makes one over a c10d store in this process (no round is run)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from ckptstore.rendezvous import BACKEND, create_handler
    from harness.nodes import free_port

    params = RendezvousParameters(
        backend=BACKEND,
        endpoint=f"127.0.0.1:{free_port()}",
        run_id="torch-range",
        min_nodes=1,
        max_nodes=1,
        is_host=True,
        local_addr="127.0.0.1",
    )
    handler = create_handler(params)
    try:
        assert handler.get_backend() == BACKEND
    finally:
        handler.shutdown()


def test_docs_architecture_lists_every_private_name() -> None:
    """docs/ARCHITECTURE.md's table ("torch's private names") names every entry here."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
        doc = f.read()
    table = doc[doc.index("## torch's private names") :]
    missing = [f"{e.module}.{e.name}" for e in PRIVATE if e.name.split(".")[-1] not in table]
    assert not missing, f"docs/ARCHITECTURE.md's list lacks {missing}"


def test_make_test_torch_runs_every_tested_release() -> None:
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as f:
        listed = re.search(r"^TORCH_TESTED := (.*)$", f.read(), re.M)
    assert listed and tuple(listed.group(1).split()) == TESTED, (
        "the Makefile's TORCH_TESTED (what make test-torch runs) is not TESTED"
    )
