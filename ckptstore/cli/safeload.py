"""Loading pickled bytes for ``ckptstore-tool`` without running code the user did not allow.

Three kinds of pickle reach the CLI, and none runs arbitrary code by default:

* ``.metadata`` always goes through ``ckptstore.format.load_metadata`` (an unpickler
  that resolves only DCP's metadata classes), then ``check_metadata``; ``--allow-pickle``
  does not change that.
* a ``torch.save`` file, and each non-tensor (object) item of a DCP checkpoint, load with
  ``torch.load(weights_only=True)``: tensors, containers, numbers, strings, ``io.BytesIO``.
  Anything else (a custom class, ``fractions.Fraction``, a crafted reduce) is refused with
  an error naming the file or item, the class, and ``--allow-pickle``.
* with ``--allow-pickle`` they load with ``weights_only=False``: the user trusts the file.

A checkpoint whose bytes verify against a committed manifest only proves the bytes are the
ones whoever wrote the manifest meant (a manifest can be re-signed), not who that was, so
verified and stock checkpoints get the same default.

``SafeLoadPlanner`` is torch's ``_EmptyStateDictLoadPlanner`` (rebuild the state dict from
the metadata, as ``dcp_to_torch_save`` does) with ``load_bytes`` going through
``load_object`` instead of ``torch.load(weights_only=False)``.
"""

from __future__ import annotations

import io
import pickle
import re
from typing import Any

from torch.distributed.checkpoint.planner import ReadItem

from ckptstore.errors import ConfigError, CorruptCheckpointError, torch_name

with torch_name("DCP's _nested_dict.set_element and _EmptyStateDictLoadPlanner"):
    from torch.distributed.checkpoint._nested_dict import set_element  # type: ignore[attr-defined]
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

__all__ = ["ALLOW_PICKLE_FLAG", "load_object", "load_torch_file", "SafeLoadPlanner"]

ALLOW_PICKLE_FLAG = "--allow-pickle"

_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    inner = text.find("WeightsUnpickler error:")
    if inner >= 0:
        text = text[inner + len("WeightsUnpickler error:") :].strip()
    first = text.splitlines()[0].strip() if text else ""
    first = first.split(". ")[0].rstrip(".")[:160]  # torch's advice after it is not ours
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _refused(source: str, what: str, cls: str, unverified: bool) -> ConfigError:
    trust = " It is unverified (no ckptstore manifest)." if unverified else ""
    return ConfigError(
        f"{source} {what} a pickled Python object of class {cls}, which torch.load's safe mode "
        f"(weights_only=True) does not run.{trust} Pass {ALLOW_PICKLE_FLAG} only if you trust "
        "whoever wrote it: unpickling can run any code."
    )


def _torch_load(data: bytes, allow_pickle: bool) -> Any:
    import torch

    if allow_pickle:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    from ckptstore.format import load_safe_object

    return load_safe_object(data)


def load_object(
    data: bytes, source: str, *, allow_pickle: bool = False, unverified: bool = False
) -> Any:
    """One DCP object item (``torch.save`` bytes) read from ``source``: weights-only unless
    ``allow_pickle``. ConfigError when safe mode refuses a class; CorruptCheckpointError
    when the bytes are not a torch.save payload at all."""
    try:
        return _torch_load(data, allow_pickle)
    except pickle.UnpicklingError as exc:
        refused = _REFUSED_GLOBAL.search(str(exc))
        if refused and not allow_pickle:
            raise _refused(source, "is", refused.group(1), unverified) from None
        raise CorruptCheckpointError(
            f"{source} is not a readable torch.save payload ({_first_line(exc)}); the "
            "checkpoint is damaged."
        ) from None
    except Exception as exc:  # noqa: BLE001 - hostile bytes fail in many ways; one error
        raise CorruptCheckpointError(
            f"{source} is not a readable torch.save payload ({_first_line(exc)}); the "
            "checkpoint is damaged."
        ) from None


def load_torch_file(data: bytes, source: str, *, allow_pickle: bool = False) -> Any:
    """The object a ``torch.save`` file holds: weights-only unless ``allow_pickle``.
    ConfigError when safe mode refuses a class (names it and ``--allow-pickle``);
    CorruptCheckpointError when the file is empty, truncated or not torch.save at all."""
    if not data:
        raise CorruptCheckpointError(f"{source} is empty (0 bytes); it holds no checkpoint.")
    try:
        return _torch_load(data, allow_pickle)
    except pickle.UnpicklingError as exc:
        refused = _REFUSED_GLOBAL.search(str(exc))
        if refused and not allow_pickle:
            raise _refused(source, "holds", refused.group(1), unverified=False) from None
        raise _unreadable(source, exc) from None
    except Exception as exc:  # noqa: BLE001 - truncated / garbage files fail in many ways
        raise _unreadable(source, exc) from None


def _unreadable(source: str, exc: BaseException) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{source} is not a readable torch.save file ({_first_line(exc)}): it is truncated, "
        "damaged or another format. Copy it again from where it was written."
    )


class SafeLoadPlanner(_EmptyStateDictLoadPlanner):  # type: ignore[misc]
    """``_EmptyStateDictLoadPlanner`` whose object items load through ``load_object``."""

    def __init__(
        self,
        keys: list[str] | None = None,
        *,
        source: str,
        allow_pickle: bool = False,
        unverified: bool = False,
    ) -> None:
        super().__init__(keys=keys)
        self.source = source
        self.allow_pickle = allow_pickle
        self.unverified = unverified

    def _should_include_key(self, key: str, metadata: Any) -> bool:
        if self.keys is None or key in self.keys:
            return True
        path = (metadata.planner_data or {}).get(key) or ()
        prefix = ""
        for part in path:  # model.layers.0 selects model.layers.0.weight
            prefix = f"{prefix}.{part}" if prefix else str(part)
            if prefix in self.keys:
                return True
        return False

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Load an object item through ``load_object`` (weights-only unless ``allow_pickle``)."""
        fqn = read_item.dest_index.fqn
        obj = load_object(
            value.getvalue(),
            f"{self.source}: item {fqn!r}",
            allow_pickle=self.allow_pickle,
            unverified=self.unverified,
        )
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj
