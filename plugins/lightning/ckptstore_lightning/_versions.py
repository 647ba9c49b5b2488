"""The framework versions each plugin is built and tested against.

A plugin module calls ``require(name)`` right after importing its framework, so a version
outside the range fails at import with the range and the command that installs a
supported one, rather than later with an ``AttributeError`` from deep inside the
framework. The lower bounds are the ``ckptstore[lightning]`` / ``ckptstore[hf]`` extras;
the upper bounds are the next major versions, whose internals the plugins have not met.
"""

from __future__ import annotations

from importlib import metadata

from ckptstore.errors import ConfigError

__all__ = ["SUPPORTED", "check", "require"]

#: distribution name -> (specifier, the extra that installs it)
SUPPORTED: dict[str, tuple[str, str]] = {
    "lightning": (">=2.2,<3", "lightning"),
    "transformers": (">=4.40,<6", "hf"),
    "accelerate": (">=0.30,<2", "hf"),
}


def check(name: str, installed: str) -> None:
    """Raise ``ConfigError`` if version ``installed`` of ``name`` is outside its range."""
    from packaging.specifiers import SpecifierSet  # every supported framework requires it
    from packaging.version import InvalidVersion, Version

    spec, extra = SUPPORTED[name]
    try:
        ok = Version(installed) in SpecifierSet(spec, prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        raise ConfigError(
            f"ckptstore's {name} plugin supports {name}{spec}, but {name} {installed} is "
            f"installed; run: pip install '{name}{spec}' (or pip install 'ckptstore[{extra}]')"
        )


def require(name: str) -> str:
    """The installed version of ``name``, checked against ``SUPPORTED``."""
    installed = metadata.version(name)
    check(name, installed)
    return installed
