"""The adversarial suite reuses the CLI tests' fixtures: ``backend`` (every store the CLI
tests run on), ``root_url`` (a fresh run root there) and ``cli`` (the tool in-process)."""

from tests.cli.conftest import backend, cli, root_url  # noqa: F401 - fixtures, found by name
