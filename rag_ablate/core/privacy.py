"""Confidential corpora: what of a query's text is stored, and redaction of personal data.

Two settings (``privacy`` in the config, docs/architecture.md "Confidential corpora"):

* ``privacy.store_text=false``: passage text, query text and answers never reach a file the run
  writes or MLflow. Records keep ids, offsets, scores, statuses, timings and metrics; their
  ``query`` and ``answer`` keys are left out; error messages lose the response-body excerpts
  they would quote (:func:`body_excerpts_allowed`) and any quoted text; MLflow traces carry ids
  only. Answer metrics are computed before the text is dropped, so they are in the records but
  cannot be recomputed from them.
* ``privacy.redact=true``: every text that is stored (query text, answers, error messages,
  trace inputs and outputs, the passages of a trace, flips) goes through :func:`redact_text`
  first. It replaces e-mail addresses, phone numbers, Chinese national id numbers and bank card
  numbers by ``[EMAIL]``, ``[PHONE]``, ``[CN_ID]`` and ``[CARD]``; each record counts what was
  replaced (``redacted``) and the run logs the sums as ``privacy/redacted_<kind>``. The detectors
  read the text's normal form (:func:`normalise`: NFKC, dashes as ``-``), so full-width digits,
  ``＠`` and no-break spaces hide nothing; the original characters are replaced.

Worked examples (``redact_text`` returns the text and the counts)::

    "Mail zhang.san@example.com or call +1 (415) 555-0100"
        -> "Mail [EMAIL] or call [PHONE]"                       {"email": 1, "phone": 1}
    "请拨打 138 1234 5678，身份证 11010519491231002X"
        -> "请拨打 [PHONE]，身份证 [CN_ID]"                      {"phone": 1, "cn_id": 1}
    "卡号 4111-1111-1111-1111，订单号 20240501123456，价格 ¥1299.00"
        -> "卡号 [CARD]，订单号 20240501123456，价格 ¥1299.00"  {"card": 1}

    "手机１５９.１２３４.５６７８，邮箱 li＠例子.中国，卡号,4111\u00a01111\u00a01111\u00a01111"
        -> "手机[PHONE]，邮箱 [EMAIL]，卡号,[CARD]"          {"phone": 1, "email": 1, "card": 1}

The order number is not a card: 20240501123456 fails the Luhn check (its digit sum is 37).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import re
import threading
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import wraps
from typing import Any, Protocol, TypeVar, cast

KINDS = ("email", "phone", "cn_id", "card")  # in the order they are searched for
PLACEHOLDERS = {kind: f"[{kind.upper()}]" for kind in KINDS}  # [EMAIL] [PHONE] [CN_ID] [CARD]
METRIC_PREFIX = "privacy/redacted_"  # run metrics: privacy/redacted_email, ..., privacy/redacted_total
WITHHELD = "<withheld: privacy.store_text=false>"  # what stands where quoted text was

Counts = dict[str, int]
# a record (rag_ablate.records.trace.Record, a layer above this one) or any mapping of its shape
R = TypeVar("R", bound=Mapping[str, Any])
F = TypeVar("F", bound=Callable[..., Any])


class JudgedAnswer(Protocol):
    """Anything with an answer and per-metric error messages (a judge calibration item)."""

    answer: str
    errors: dict[str, str]


T = TypeVar("T", bound=JudgedAnswer)

# ---------------------------------------------------------------------------- detectors

# ASCII local part; domain labels in any script (例子.中国, münchen.de) or punycode (xn--...)
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9_%+-])(?<![A-Za-z0-9]\.)[A-Za-z0-9][A-Za-z0-9._%+-]*@(?:[^\W_][\w-]*\.)+"
    r"(?:[A-Za-z]{2,}(?![A-Za-z0-9-])|xn--[A-Za-z0-9-]+|[^\W\d_A-Za-z]{2,})"
)
# 6-digit region, birth date YYYYMMDD (1800-2099), 3-digit sequence, check character
_CN_ID = re.compile(
    r"(?<![0-9A-Za-z])[1-9]\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\d{3}[\dXx]"
    r"(?![0-9A-Za-z])"
)
# a run of digits with single spaces or dashes between them (card and grouped id candidates are
# cut from it; an id's last group may end in X); after a comma or a period only when no digit
# precedes it (1,299.00 is no card, 卡号,4111... may be)
_DIGIT_RUN = re.compile(r"(?<![0-9A-Za-z+])(?<!\d[.,])\d+(?:[ -]\d+)*[Xx]?(?![0-9A-Za-z])(?![.,]\d)")
_PHONES = (
    # Chinese mobile: 1[3-9]x xxxx xxxx, one kind of space, dash or dot between groups, +86/0086 optional
    re.compile(r"(?<![\d+])(?:(?:\+|00)86[ .-]?)?1[3-9]\d([ .-]?)\d{4}\1\d{4}(?!\.?\d)"),
    # international with a leading +: +1 415 555 0100, +44 20 7946 0958, +1 (415) 555-0100, +44.20.7946.0958
    re.compile(r"(?<![\w+])\+\d{1,3}(?:[ .-]?(?:\(\d{1,4}\)|\d{1,4})){2,6}(?!\.?\d)"),
    # North American: (415) 555-0100, (415)555-0100, 415-555-0100, 415.555.0100
    re.compile(
        r"(?<![\w+-])(?<!\d\.)(?:\([2-9]\d{2}\) ?\d{3}[- ]\d{4}|[2-9]\d{2}([-.])\d{3}\1\d{4})(?![\w-])"
    ),
    # Chinese landline with its area code: 010-12345678, (021) 6123 4567, 0755-1234567
    re.compile(r"(?<![\w+-])(?:\(0\d{2,3}\) ?|0\d{2,3}-)\d{3,4} ?\d{4}(?!\d)"),
)
_CN_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_CN_ID_CHECK = "10X98765432"  # the check character for (weighted sum mod 11) = 0, 1, ..., 10


def cn_id_check_char(first17: str) -> str:
    """The check character of a Chinese national id number (GB 11643): the first 17 digits
    weighted by 7 9 10 5 8 4 2 1 6 3 7 9 10 5 8 4 2, summed, mod 11, looked up in ``10X98765432``."""
    total = sum(int(d) * w for d, w in zip(first17, _CN_ID_WEIGHTS, strict=True))
    return _CN_ID_CHECK[total % 11]


def is_cn_id(text: str) -> bool:
    """An 18-character Chinese national id number: a real birth date and a matching check character.

    One random 18-digit number in eleven has a matching check character; the birth date (a real
    calendar day from 1800 on) rules out most of the rest, so order numbers are not taken for ids.
    """
    if not _CN_ID.fullmatch(text):
        return False
    try:
        datetime.date(int(text[6:10]), int(text[10:12]), int(text[12:14]))
    except ValueError:
        return False
    return cn_id_check_char(text[:17]) == text[17].upper()


def luhn_valid(digits: str) -> bool:
    """The Luhn check of a card number: from the right, every second digit doubled (minus 9 above
    9), all summed; valid when the sum is a multiple of 10."""
    if not digits.isdigit():
        return False
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


@dataclass(frozen=True)
class Found:
    """One piece of personal data in a text: its kind and its ``[start, end)`` character span."""

    kind: str
    start: int
    end: int


def _grouped_spans(text: str, accept: Callable[[str], bool]) -> Iterator[tuple[int, int]]:
    """Numbers written whole or in groups of at least 3 digits with one kind of separator
    (4111 1111 1111 1111, 110105-19491231-002X) whose digits ``accept`` takes. In a longer run of
    groups (a card and a year) the longest accepted run of whole groups is taken."""
    for m in _DIGIT_RUN.finditer(text):
        groups = [(g.start() + m.start(), g.end() + m.start()) for g in re.finditer(r"\d+[Xx]?", m.group())]
        if len(groups) > 1 and len(set(re.findall(r"[ -]", m.group()))) > 1:
            continue
        i = 0
        while i < len(groups):
            best = None
            for j in range(len(groups), i, -1):  # the longest run of whole groups first
                part = groups[i:j]
                if len(part) > 1 and any(e - s < 3 for s, e in part):
                    continue
                if accept("".join(text[s:e] for s, e in part)):
                    best = j
                    break
            if best is None:
                i += 1
            else:
                yield groups[i][0], groups[best - 1][1]
                i = best


def _is_card(digits: str) -> bool:
    """Bank card numbers: 13-19 digits, Luhn-valid."""
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


def _phone_ok(span: str) -> bool:
    n = sum(ch.isdigit() for ch in span)
    return 7 <= n <= 15


# separators NFKC leaves alone that people write between groups of digits: dashes and minus signs
_DASHES = dict.fromkeys(map(ord, "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\u30fc"), "-")


def normalise(text: str) -> tuple[str, list[int]]:
    """``text`` as the detectors read it, and where each of its characters came from.

    Each character is put in NFKC form (full-width digits, letters, ``＠``, ``．``, ``（）`` and
    ``，`` become ASCII; no-break, narrow and ideographic spaces become spaces) and dashes become
    ``-``. ``origin[i]`` is the index in ``text`` of the character that gave character ``i``, and
    ``origin[len]`` is ``len(text)``, so a span found in the normal form maps back to the original
    characters."""
    if text.isascii():
        return text, list(range(len(text) + 1))
    out = [_normal_char(ch) for ch in text]
    if all(len(n) == 1 for n in out):  # the common case: one character for one
        return "".join(out), list(range(len(text) + 1))
    origin = [i for i, n in enumerate(out) for _ in n]
    origin.append(len(text))
    return "".join(out), origin


@functools.lru_cache(maxsize=4096)
def _normal_char(ch: str) -> str:
    return unicodedata.normalize("NFKC", ch).translate(_DASHES)


def find_pii(text: str) -> list[Found]:
    """Every piece of personal data in ``text``, in text order, without overlaps; spans are of
    ``text`` itself, though the search reads its normal form (:func:`normalise`), so ``１５９ １２３４
    ５６７８`` and ``张三＠例子．中国`` are found.

    Searched for in this order, each over what the earlier ones left: e-mail addresses (the domain
    in any script), Chinese national id numbers whole or in groups (:func:`is_cn_id`), bank card
    numbers (:func:`luhn_valid`), phone numbers (Chinese mobiles with optional +86 and spaces,
    dashes or dots, + international numbers, North American ``(415) 555-0100`` / ``415-555-0100``
    / ``415.555.0100``, Chinese landlines with an area code ``010-12345678``).
    """
    norm, origin = normalise(text)
    taken = [False] * len(norm)
    found: list[Found] = []

    def add(kind: str, start: int, end: int) -> None:
        if not any(taken[start:end]):
            taken[start:end] = [True] * (end - start)
            found.append(Found(kind, origin[start], origin[end - 1] + 1))

    for m in _EMAIL.finditer(norm):
        add("email", m.start(), m.end())
    for start, end in _grouped_spans(norm, is_cn_id):
        add("cn_id", start, end)
    for start, end in _grouped_spans(norm, _is_card):
        add("card", start, end)
    for pattern in _PHONES:
        for m in pattern.finditer(norm):
            if _phone_ok(m.group()):
                add("phone", m.start(), m.end())
    return sorted(found, key=lambda f: f.start)


def redact_text(text: str) -> tuple[str, Counts]:
    """``text`` with every piece of personal data (:func:`find_pii`) replaced by its placeholder
    (``[EMAIL]``, ``[PHONE]``, ``[CN_ID]``, ``[CARD]``), and how many of each kind were replaced.
    The original characters are replaced, whatever their width."""
    counts: Counts = {}
    out: list[str] = []
    pos = 0
    for f in find_pii(text):
        out.append(text[pos : f.start])
        out.append(PLACEHOLDERS[f.kind])
        counts[f.kind] = counts.get(f.kind, 0) + 1
        pos = f.end
    out.append(text[pos:])
    return "".join(out), counts


def add_counts(total: Counts, more: Mapping[str, int]) -> Counts:
    """``total`` plus ``more``, kind by kind (a new dict)."""
    out = dict(total)
    for kind, n in more.items():
        if n:
            out[kind] = out.get(kind, 0) + int(n)
    return out


# ---------------------------------------------------------------------------- quoted text

# a quoted part long enough to be text (a short one names a key, a path or a one-word reply)
_QUOTED = re.compile(r"'[^'\n]{16,}'|\"[^\"\n]{16,}\"|“[^”\n]{16,}”|‘[^’\n]{16,}’|「[^」\n]{16,}」")
_body_lock = threading.Lock()
_bodies_allowed = True  # process-wide: jobs of a sweep run one after another in one process


def body_excerpts_allowed() -> bool:
    """False while a job with ``privacy.store_text=false`` runs: error messages then say how long
    a response body was instead of quoting it (``rag_ablate.core.retry.excerpt``)."""
    return _bodies_allowed


@contextmanager
def body_excerpts(allowed: bool) -> Iterator[None]:
    """Allow or forbid quoting response bodies in error messages while the block runs."""
    global _bodies_allowed
    with _body_lock:
        before, _bodies_allowed = _bodies_allowed, allowed
    try:
        yield
    finally:
        with _body_lock:
            _bodies_allowed = before


def scoped(fn: F) -> F:
    """Run a job (a function of the composed Hydra config) under its ``privacy.store_text``:
    response bodies are not quoted in its error messages when it is false."""

    @wraps(fn)
    def wrapper(cfg: Any, *args: Any, **kwargs: Any) -> Any:
        section = cfg.get("privacy") if hasattr(cfg, "get") else None
        store = True if section is None else bool(section.get("store_text", True))
        with body_excerpts(store):
            return fn(cfg, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def withhold_quotes(message: str, known: Iterable[str | None] = ()) -> str:
    """An error message without the text it quotes: every quoted part of 16 characters or more
    (``'...'``, ``"..."``, ``“...”``) and every occurrence of a ``known`` text (the query, the answer)
    becomes :data:`WITHHELD`. Shorter quotes (a key, a mapping path, a one-word reply) and what the
    message says about ids, statuses and sizes are kept."""
    for text in sorted({t for t in known if t and t.strip()}, key=len, reverse=True):
        message = message.replace(text, WITHHELD)
    return _QUOTED.sub(WITHHELD, message)


# ---------------------------------------------------------------------------- the policy


@dataclass(frozen=True)
class Privacy:
    """What a run stores of its text: built from ``privacy`` (``PrivacyConfig``)."""

    store_text: bool = True
    redact: bool = False

    @classmethod
    def from_config(cls, cfg: Any) -> Privacy:
        return cls(store_text=bool(cfg.store_text), redact=bool(cfg.redact))

    @property
    def active(self) -> bool:
        """True when anything is withheld or redacted (the default stores text as it is)."""
        return not self.store_text or self.redact

    def text(self, value: str | None) -> str | None:
        """A passage, query or answer as it may be stored: None when text is not stored, redacted
        with ``redact``, else as it is."""
        if value is None or not self.store_text:
            return None
        return redact_text(value)[0] if self.redact else value

    def message(self, value: str, known: Iterable[str | None] = ()) -> tuple[str, Counts]:
        """An error message as it may be stored, and what redaction replaced in it."""
        if not self.store_text:
            value = withhold_quotes(value, known)
        return redact_text(value) if self.redact else (value, {})

    def record(self, rec: R) -> R:
        """The stored form of a record (a new dict of the same type; ``rec`` is left as it is).

        ``store_text=false``: no ``query``, ``answer`` and ``rewritten_query`` keys, no ``text`` in
        the ``context`` entries, error messages without quoted text. ``redact=true``: those texts
        and error messages (the record's and the judge's) redacted, and ``redacted`` holds the
        counts of what was replaced, added to the counts the record had (a record redacted before
        keeps its counts: resume= reads it back).
        """
        if not self.active:
            return cast(R, dict(rec))
        out: dict[str, Any] = dict(rec)
        counts: Counts = dict(rec.get("redacted") or {})
        known = (rec.get("query"), rec.get("answer"))
        for key in ("query", "answer", "rewritten_query"):
            if key not in out:
                continue
            if not self.store_text:
                del out[key]
            elif self.redact and isinstance(out[key], str):
                out[key], found = redact_text(out[key])
                counts = add_counts(counts, found)
        if isinstance(out.get("context"), list):
            out["context"], found = self._context(out["context"])
            counts = add_counts(counts, found)
        if isinstance(out.get("error"), str):
            out["error"], found = self.message(out["error"], known)
            counts = add_counts(counts, found)
        if out.get("judge") is not None:
            out["judge"], found = self._messages(out["judge"], known)
            counts = add_counts(counts, found)
        if self.redact:
            out["redacted"] = {kind: counts.get(kind, 0) for kind in KINDS}
        return cast(R, out)  # the same keys but query/answer/rewritten_query (optional ones) and redacted

    def _context(self, entries: list[Any]) -> tuple[list[Any], Counts]:
        """A record's ``context`` entries as stored: without ``text`` unless text is stored, redacted."""
        out: list[Any] = []
        counts: Counts = {}
        for entry in entries:
            entry = dict(entry)
            if not self.store_text:
                entry.pop("text", None)
            elif self.redact and isinstance(entry.get("text"), str):
                entry["text"], found = redact_text(entry["text"])
                counts = add_counts(counts, found)
            out.append(entry)
        return out, counts

    def judged_answer(self, item: T) -> T:
        """A judged answer that is not a record (a dataclass with ``answer`` and ``errors``, such as
        a judge calibration item) as it may be stored: its answer empty without ``store_text``,
        redacted with ``redact``; its error messages as :meth:`message` stores them."""
        if not self.active:
            return item
        answer = str(item.answer)
        errors = {k: self.message(v, [answer])[0] for k, v in item.errors.items()}
        return dataclasses.replace(item, answer=self.text(answer) or "", errors=errors)  # type: ignore[type-var]

    def _messages(self, node: Any, known: Sequence[str | None]) -> tuple[Any, Counts]:
        """Every ``error``/``errors`` string inside a judge's value, as :meth:`message` stores it."""
        counts: Counts = {}
        if isinstance(node, list):
            items = []
            for item in node:
                value, found = self._messages(item, known)
                items.append(value)
                counts = add_counts(counts, found)
            return items, counts
        if not isinstance(node, dict):
            return node, counts
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "error" and isinstance(value, str):
                out[key], found = self.message(value, known)
            elif key == "errors" and isinstance(value, dict):
                out[key] = {}
                found = {}
                for name, msg in value.items():
                    if isinstance(msg, str):
                        out[key][name], more = self.message(msg, known)
                        found = add_counts(found, more)
                    else:
                        out[key][name] = msg
            else:
                out[key], found = self._messages(value, known)
            counts = add_counts(counts, found)
        return out, counts

    def run_metrics(self, records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
        """``privacy/redacted_<kind>`` and ``privacy/redacted_total``: what redaction replaced in
        the stored records (nothing without ``redact``)."""
        if not self.redact:
            return {}
        totals: Counts = {}
        for rec in records:
            totals = add_counts(totals, rec.get("redacted") or {})
        out = {f"{METRIC_PREFIX}{kind}": float(totals.get(kind, 0)) for kind in KINDS}
        out[f"{METRIC_PREFIX}total"] = float(sum(totals.values()))
        return out
