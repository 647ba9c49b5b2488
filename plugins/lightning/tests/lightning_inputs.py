"""Crafted Lightning pointers: the attack inputs of test_lightning_untrusted.py and the seeds
of test_lightning_fuzz.py. No framework is imported here (the fuzz tests stay fast)."""

from __future__ import annotations

import json

from ckptstore_lightning._names import POINTER_FORMAT

__all__ = ["pointer", "MALFORMED_POINTERS"]


def pointer(root: str, step: int, follow: str = "step", **extra) -> bytes:
    doc = {"format": POINTER_FORMAT, "version": 1, "root": root, "step": step, "follow": follow}
    doc.update(extra)
    return json.dumps(doc).encode()


_GOOD = json.loads(pointer(".", 2))
MALFORMED_POINTERS = {
    "not-json": b"{not json",
    "not-utf8": b'{"format": "\xff\xfe"}',
    "a-list": b'[{"format": "ckptstore.lightning-pointer"}]',
    "another-format": json.dumps({**_GOOD, "format": "other"}).encode(),
    "missing-step": json.dumps({k: v for k, v in _GOOD.items() if k != "step"}).encode(),
    "missing-root": json.dumps({k: v for k, v in _GOOD.items() if k != "root"}).encode(),
    "extra-key": json.dumps({**_GOOD, "x": 1}).encode(),
    "step-a-string": json.dumps({**_GOOD, "step": "1"}).encode(),
    "step-a-bool": json.dumps({**_GOOD, "step": True}).encode(),
    "step-negative": json.dumps({**_GOOD, "step": -1}).encode(),
    "step-huge": json.dumps({**_GOOD, "step": 10**40}).encode(),
    "step-a-float": json.dumps({**_GOOD, "step": 1.0}).encode(),
    "root-a-number": json.dumps({**_GOOD, "root": 5}).encode(),
    "root-empty": json.dumps({**_GOOD, "root": ""}).encode(),
    "root-control-char": json.dumps({**_GOOD, "root": "/tmp/\x00x"}).encode(),
    "follow-unknown": json.dumps({**_GOOD, "follow": "all"}).encode(),
    "version-2": json.dumps({**_GOOD, "version": 2}).encode(),
    "deep-nesting": b'{"a":' + b"[" * 30_000 + b"]" * 30_000 + b"}",  # RecursionError
    "oversized": b'{"format": "ckptstore.lightning-pointer", "pad": "' + b"x" * 70_000 + b'"}',
}
