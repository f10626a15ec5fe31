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
* **as a credential**: ``'Bearer KEY'`` in any value, or a value shaped like a key whatever its
  name (``+system.body.k=sk-...``, a misspelt ``+system.body.api_kye=...``): the well-known shapes
  (``sk-...``, ``ghp_``/``github_pat_``, ``AKIA...``, ``xox?-...``, a JWT) keep their prefix and
  lose the rest, and a long token that mixes upper case, lower case and digits at random is
  replaced whole (:func:`hide_credentials`, :func:`hide_key_shapes`). Hex hashes, ids and words do
  not read as keys: a config hash, a git SHA, a run id or a document id is never hidden.

``rag_ablate.config.keys.redact`` applies all three to a config before it is written or logged.
"""

from __future__ import annotations

import itertools
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
    """``text`` with URL userinfo hidden (:func:`hide_userinfo`), the token after ``Bearer``
    (8 characters or more) replaced by ``***`` and every value shaped like a key hidden
    (:func:`hide_key_shapes`)."""
    return hide_key_shapes(_CREDENTIAL.sub(rf"\g<1>\g<2>{MASK}", hide_userinfo(text)))


# well-known key shapes, each kept up to its prefix: OpenAI/Anthropic-style sk-..., GitHub tokens,
# AWS access key ids, Slack tokens; a JWT (three base64url parts, the first two JSON objects) whole
_KEY_SHAPES = re.compile(
    r"(?<![A-Za-z0-9_-])(?:"
    r"(sk-)(?=[A-Za-z0-9_-]*\d)[A-Za-z0-9_-]{12,}"
    r"|(gh[pousr]_)[A-Za-z0-9]{20,}"
    r"|(github_pat_)[A-Za-z0-9_]{20,}"
    r"|((?:AKIA|ASIA)(?=[A-Z0-9]{16}(?![A-Za-z0-9])))[A-Z0-9]{16}"
    r"|(xox[abposr]-)[A-Za-z0-9-]{10,}"
    r"|()eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"
    r")"
)
# a candidate for a random token: 32 or more letters, digits, - _ + (no / or .: paths, hosts), and
# base64's closing = signs
_LONG_TOKEN = re.compile(r"(?<![A-Za-z0-9_+-])[A-Za-z0-9_+-]{32,}={0,2}(?![A-Za-z0-9_+=-])")


def _random_looking(token: str) -> bool:
    """Whether a long token mixes upper case, lower case and digits as random text does: all three
    present and the kind of character changing at a third of its positions or more (a model name
    such as ``paraphrase-multilingual-MiniLM-L12-v2`` changes at a fifth; hex hashes have no upper
    case)."""
    kinds = ["u" if c.isupper() else "l" if c.islower() else "d" if c.isdigit() else "" for c in token]
    kinds = [k for k in kinds if k]
    if not {"u", "l", "d"} <= set(kinds):
        return False
    changes = sum(a != b for a, b in itertools.pairwise(kinds))
    return changes >= len(kinds) / 3


def hide_key_shapes(text: str) -> str:
    """``text`` with every value shaped like an API key replaced: ``sk-proj-4f1c...`` -> ``sk-***``,
    ``ghp_...`` -> ``ghp_***``, ``AKIA...`` -> ``AKIA***``, ``xoxb-...`` -> ``xoxb-***``, a JWT and
    any long random-looking token (:func:`_random_looking`) -> ``***``."""
    text = _KEY_SHAPES.sub(lambda m: "".join(g for g in m.groups() if g) + MASK, text)
    return _LONG_TOKEN.sub(lambda m: MASK if _random_looking(m.group()) else m.group(), text)


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
