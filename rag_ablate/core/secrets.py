"""Secrets a careless command line can carry, and how they are kept out of what is stored.

Three ways a key reaches a run besides an environment variable:

* **in a URL**: ``generator.base_url=http://user:KEY@host/v1``. :func:`split_userinfo` takes the
  user and password out of the URL: clients send them as HTTP basic auth (as httpx would) and
  name the URL without them; :func:`hide_userinfo` replaces the user and password of every URL in
  a text by ``***`` (config values, overrides, run names, error messages)::

      "http://user:KEY@host/v1"  ->  "http://***@host/v1"

* **under a name that says it is one**: ``+system.body.api_key=KEY``, ``+system.header.X-Token=KEY``
  (a misspelt ``headers``): :func:`is_secret_name` (a part of the key is ``key``, ``token``,
  ``secret``, ``password``, ``auth`` ...; ``api_key_env``, the name of a variable, is not);
* **as a credential**: ``'Bearer KEY'`` in any value (:func:`hide_credentials`).

``rag_ablate.config.keys.redact`` applies all three to a config before it is written or logged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

MASK = "***"

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s'\"]+@")  # to the last @ of the host part
_CREDENTIAL = re.compile(r"(?i)\b(bearer)(\s+)[A-Za-z0-9._~+/=-]{8,}")
# parts of a key name (split at _ - . and case changes) that say its value is a secret
_SECRET_PARTS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "pwd", "pass", "auth", "authorization"}
    | {"credential", "credentials", "cookie", "bearer", "signature", "sig"}
)
# a last part that says the value names where the secret is, not the secret (api_key_env=OPENAI_API_KEY)
_NAMES_ONLY = frozenset({"env", "var", "file", "path", "name", "header", "headers"})


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its ``user:password@`` part, and that user and password (None without them).
    ``http://u:KEY@host/v1`` -> (``http://host/v1``, (``u``, ``KEY``)); percent-escapes decoded."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=host)), (unquote(user), unquote(password))


def hide_userinfo(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it replaced by ``***@``."""
    return _USERINFO.sub(rf"\g<1>{MASK}@", text) if "@" in text else text


def hide_credentials(text: str) -> str:
    """``text`` with URL userinfo hidden (:func:`hide_userinfo`) and the token after ``Bearer``
    (8 characters or more) replaced by ``***``."""
    return _CREDENTIAL.sub(rf"\g<1>\g<2>{MASK}", hide_userinfo(text))


_KEY_LIKE = re.compile(r"(?=[^\s]*\d)(?=[^\s]*[A-Za-z])[A-Za-z0-9._~+/=-]{20,}")


def looks_like_key(value: str) -> bool:
    """Whether ``value`` reads like an API key or token: 20 characters or more of letters, digits and
    ``._~+/=-`` with both letters and digits (``sk-proj-4f1c...``); what an error message about an
    unknown setting does not echo."""
    return bool(_KEY_LIKE.fullmatch(value.strip("'\"")))


def is_secret_name(key: str) -> bool:
    """Whether the dotted config ``key`` names a secret by one of its parts: ``system.body.api_key``,
    ``system.header.X-Api-Token``, ``tracking.password``; not ``generator.api_key_env`` (the name of
    a variable), ``generator.max_tokens`` or ``judge.keys_en``."""
    words = [w.lower() for w in re.split(r"[._\-/]+|(?<=[a-z])(?=[A-Z])", key) if w]
    if not words or words[-1] in _NAMES_ONLY:
        return False
    return any(w in _SECRET_PARTS for w in words)


@contextmanager
def hidden_in_logs(swaps: Mapping[str, str]) -> Iterator[None]:
    """While the block runs, every log record's message has each key of ``swaps`` replaced by its
    value, and URL passwords hidden: a launcher logs each job's overrides as given
    (``#0 : +system.headers.Authorization=Bearer KEY``), which must show ``***`` instead."""
    before = logging.getLogRecordFactory()
    ordered = sorted(swaps.items(), key=lambda kv: -len(kv[0]))

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = before(*args, **kwargs)
        message = record.getMessage()
        hidden = message
        for secret, shown in ordered:
            hidden = hidden.replace(secret, shown)
        hidden = hide_credentials(hidden)
        if hidden != message:
            record.msg, record.args = hidden, ()
        return record

    logging.setLogRecordFactory(factory)
    try:
        yield
    finally:
        logging.setLogRecordFactory(before)
