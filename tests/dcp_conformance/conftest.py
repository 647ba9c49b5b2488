"""The "backend" columns of the DCP conformance suite.

Every case runs once per column: ckptstore's writer/reader on a volume, ckptstore on S3
(a real SeaweedFS), and stock ``FileSystemWriter`` / ``FileSystemReader`` as the control,
which must pass everything. Where ckptstore deliberately differs from stock DCP
(``use_collectives=False`` is refused), the case says so and checks the refusal.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.conftest import BUCKET


@dataclass(frozen=True)
class Backend:
    """Where checkpoints go and which StorageWriter/Reader write and read them (pickles,
    so multi-process cases hand it to every rank)."""

    kind: str  # "volume" | "s3" | "stock"
    base: str  # a directory, or s3://bucket/prefix
    storage_options: dict[str, Any] = field(default_factory=dict)

    @property
    def is_ckptstore(self) -> bool:
        return self.kind != "stock"

    @property
    def is_local(self) -> bool:
        return self.kind != "s3"

    def url(self, name: str) -> str:
        return f"{self.base}/{name}" if self.kind == "s3" else os.path.join(self.base, name)

    def writer(
        self, name: str, *, overwrite: bool = False, local_tier_dir: str | None = None
    ) -> Any:
        if self.kind == "stock":
            from torch.distributed.checkpoint import FileSystemWriter

            return FileSystemWriter(self.url(name), overwrite=overwrite)
        if local_tier_dir is not None:
            from ckptstore.tier.tier_writer import TierWriter

            return TierWriter(
                self.url(name),
                tier=local_tier_dir,
                storage_options=self.storage_options or None,
            )
        import ckptstore

        return ckptstore.writer(
            self.url(name), storage_options=self.storage_options or None, overwrite=overwrite
        )

    def reader(self, name: str) -> Any:
        if self.kind == "stock":
            from torch.distributed.checkpoint import FileSystemReader

            return FileSystemReader(self.url(name))
        import ckptstore

        return ckptstore.reader(self.url(name), storage_options=self.storage_options or None)


@pytest.fixture(
    params=["ckptstore-volume", pytest.param("ckptstore-s3", marks=pytest.mark.server), "stock"]
)
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Backend:
    if request.param == "ckptstore-s3":
        server = request.getfixturevalue("seaweedfs")
        base = f"s3://{BUCKET}/conformance-{uuid.uuid4().hex[:10]}"
        return Backend("s3", base, dict(server.storage_options))
    kind = "volume" if request.param == "ckptstore-volume" else "stock"
    return Backend(kind, str(tmp_path / "ckpts"))
