"""The fixtures the plugins' tests share (tests/plugins/fixtures.py): ``root_url`` over a
volume and S3 on the session's SeaweedFS, and no Hugging Face Hub."""

from tests.plugins.fixtures import offline, root_url  # noqa: F401 - fixtures, found by name
