"""Validation of planning inputs: :class:`InputError` and the range checks behind it."""

from __future__ import annotations

import math

from ckptstore.errors import ConfigError

__all__ = ["InputError", "check", "check_afr"]


class InputError(ConfigError):
    """A planning input is out of range or missing.

    ``fields`` are the inputs the message is about and ``template`` is the message with a
    ``{field}`` placeholder for each, so a front end can name them its own way
    (``ckptstore-tool goodput`` names its flags: :meth:`render`). ``str()`` says
    ``Owner.field must ...`` or ``Owner: ... field ...``.
    """

    def __init__(self, owner: str, template: str, *fields: str) -> None:
        self.owner, self.template, self.fields = owner, template, fields
        lead = fields[0]
        if template.startswith("{" + lead + "}"):
            message = self.render({lead: f"{owner}.{lead}"})
        else:
            message = f"{owner}: {self.render({})}"
        super().__init__(message)

    def render(self, names: dict[str, str]) -> str:
        """The message with each field spelled as ``names[field]`` (else the field's name)."""
        return self.template.format(**{f: names.get(f, f) for f in self.fields})


def check(
    owner: str,
    name: str,
    value: float | None,
    *,
    positive: bool = False,
    whole: bool = False,
    hint: str = "",
) -> None:
    """Raise InputError unless ``value`` is None, finite and >= 0 (> 0 / an int >= 1)."""
    if value is None:
        return
    got = f"; got {value!r}".replace("{", "{{").replace("}", "}}")
    kinds = int if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "a whole number" if whole else "a number"
        raise InputError(owner, f"{{{name}}} must be {kind}{hint}{got}", name)
    if not math.isfinite(value) or value < (1 if whole else 0) or (positive and value == 0):
        need = (
            "a whole number >= 1" if whole else "a finite number " + ("> 0" if positive else ">= 0")
        )
        raise InputError(owner, f"{{{name}}} must be {need}{hint}{got}", name)


def check_afr(owner: str, afr: float | None) -> None:
    """Raise InputError unless ``afr`` is None or a fraction per GPU-year in [0, 1]."""
    check(owner, "afr", afr, hint=" (a fraction per GPU-year: 1 % is 0.01)")
    if afr is not None and afr > 1:
        raise InputError(
            owner, f"{{afr}} is a fraction per GPU-year: 1 % is 0.01, not 1; got {afr!r}", "afr"
        )
