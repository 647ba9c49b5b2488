"""Fuzz the text filters every message and printed line passes through.

``ckptstore.redact.redact`` (errors, log lines, CLI output) and the CLI's ``safe`` /
``guard`` (text read from storage) parse arbitrary text: names and manifest ``extra``
values from a bucket, client messages. For any input they return a string, never raise,
are idempotent, let no planted credential through, and leave no control character.
"""

from __future__ import annotations

import json
import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ckptstore.cli.render import guard, safe
from ckptstore.redact import is_secret_name, redact

SECRET = "Zq9SecretSentinel"
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f]")

_text = st.text(max_size=200)
_names = st.sampled_from(
    ["secret", "key", "token", "password", "sas_token", "account_key", "AccountKey",
     "client_kwargs.aws_secret_access_key", "X-Amz-Signature", "sig", "connection_string"]
)  # fmt: skip
_seps = st.sampled_from(["=", ": ", " = ", "':'", '": "', "=b'", "='", '="'])
_schemes = st.sampled_from(["s3", "gs", "az", "http", "https", "ftp", "sftp", "abfss"])


@settings(max_examples=200, deadline=None)
@given(_text)
@example("\x1b]0;owned\x07\x1b[2J\rStatus      committed\nNote        all good\u202e")
@example("secret=" * 50)
@example("'" * 100 + "token" + "=" * 100)
def test_filters_never_fail_and_escape_everything(text: str) -> None:
    out = redact(text)
    assert isinstance(out, str) and redact(out) == out
    shown = safe(text)
    assert not _CONTROL.search(shown), repr(shown)
    guarded = guard(text)
    assert not _CONTROL.search(guarded.replace("\n", "").replace("\t", "")), repr(guarded)


@settings(max_examples=200, deadline=None)
@given(_text, _names, _seps, _text)
@example("Check -o ", "secret", "=", " -o bogus=1")
@example("{", "token", '": "', '", "anon": true}')
@example("cut short: ", "secret", "='", "")
def test_a_named_credential_never_survives(before: str, name: str, sep: str, after: str) -> None:
    quote = sep[-1] if sep[-1] in "'\"" and not after.startswith("!") else ""
    text = f"{before} {name}{sep}{SECRET}{quote} {after}"
    assert SECRET not in redact(text), (text, redact(text))


@settings(max_examples=200, deadline=None)
@given(_text, _schemes, st.text(alphabet="abcdefghij_-.", min_size=1, max_size=12), _text)
@example("cannot reach ", "http", "user", "/run (refused)")
def test_url_userinfo_never_survives(before: str, scheme: str, user: str, after: str) -> None:
    text = f"{before} {scheme}://{user}:{SECRET}@host.example:443/path {after}"
    assert SECRET not in redact(text), (text, redact(text))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.one_of(_names, st.text(max_size=12)),
        st.one_of(st.just(SECRET), st.integers(), st.text(max_size=20), st.none()),
        max_size=6,
    )
)
@example({"secret": 12345678, "token": SECRET, "key": [1, 2]})
def test_redacted_json_stays_json(doc: dict[str, object]) -> None:
    """``--json`` output passes through the redaction too: it must still parse."""
    text = json.dumps({"extra": doc}, indent=2)
    out = json.loads(redact(text))["extra"]
    for key, value in doc.items():
        if is_secret_name(key) and (value == SECRET or isinstance(value, int)):
            assert out[key] == "***", (key, out)  # a list or dict value is not one credential
