"""Calling a service that may fail: what an HTTP status means, how long to wait, how to quote a body,
when an endpoint counts as down (:class:`Breaker`).

Shared by every HTTP client of the package (``system=http``, ``generator=openai``, the judge,
``rerank=http``)."""

from __future__ import annotations

import email.utils
import random
import threading
from datetime import UTC, datetime
from typing import Literal, get_args

from rag_ablate.core.privacy import body_excerpts_allowed

EXCERPT_CHARS = 200  # how much of a response body an error message quotes


def excerpt(text: str | bytes) -> str:
    """The start of a body, on one line, for error messages; only its size while a job with
    ``privacy.store_text=false`` runs (:func:`rag_ablate.core.privacy.body_excerpts_allowed`)."""
    if not body_excerpts_allowed():
        size = len(text if isinstance(text, bytes) else text.encode("utf-8"))
        return f"<{size} bytes, not quoted: privacy.store_text=false>"
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    flat = " ".join(text.split())
    return flat if len(flat) <= EXCERPT_CHARS else flat[:EXCERPT_CHARS] + "..."


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header as seconds to wait: delta-seconds or an HTTP date; None if absent or bad."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = datetime.now(UTC).timestamp() if now is None else now
    return max(0.0, when.timestamp() - current)


def backoff_wait(
    retries: int, retry_after: float | None, backoff_s: float, backoff_max_s: float, rng: random.Random
) -> float:
    """Seconds to wait before try ``retries + 1``: the response's Retry-After when it has one,
    else ``backoff_s * 2**retries`` with jitter (a random 50-100% of it); capped at ``backoff_max_s``.

    Shared by every client that retries 429/5xx (``system=http``, ``generator=openai``).
    """
    wait = retry_after if retry_after is not None else backoff_s * 2**retries * rng.uniform(0.5, 1.0)
    return min(wait, backoff_max_s)


def status_meaning(code: int) -> tuple[Status, bool] | None:
    """What an HTTP status means for a query: None for 2xx, else its failure status and whether
    sending the request again may help (429 and 5xx). Shared by every HTTP client here."""
    if 200 <= code < 300:
        return None
    if code in (401, 403):
        return "access_denied", False
    return "http_error", code == 429 or code >= 500


# What became of one query. Everything but ``ok`` is a failure: excluded from quality
# means, counted in ``n_failed``/``error_rate`` and in ``error_rate_<status>``.
#   ok             the system answered (an empty retrieval list or a declining answer is ok)
#   failed         the system raised, or its trace could not be scored
#   timeout        a connect or read timeout (system=http)
#   http_error     an HTTP error status after retries, or no connection at all (``http_status`` has the code)
#   bad_response   the response did not match a configured mapping (``error`` names the path, with an excerpt)
#   access_denied  401 or 403
#   stream_cut     the answer stream ended without its end event (the partial answer is kept, not scored)
#   not_logged     system=replay: the replayed log has no line for the query
Status = Literal[
    "ok", "failed", "timeout", "http_error", "bad_response", "access_denied", "stream_cut", "not_logged"
]

STATUSES: tuple[str, ...] = get_args(Status)


BREAKER_LIMIT = 3  # tries in a row that got no response before an endpoint counts as down


class Breaker:
    """A circuit breaker: the tries in a row that got no response from one endpoint.

    Every HTTP client of the package keeps one per endpoint for the whole run (shared by its
    threads or tasks). It calls :meth:`failed` after a try that could not connect (refused,
    unreachable, connect timeout) or, with ``silent=True``, after one that connected and got no
    response within its timeout (a service that accepts connections and never answers), and
    :meth:`succeeded` after any response. After ``limit`` such tries in a row the breaker is
    :attr:`open`: the client raises :class:`~rag_ablate.core.errors.EndpointDownError` with
    :meth:`message` instead of retrying, and every later call fails at once, so a service that is
    down or hung stops the run within a few timeouts instead of costing one (or a round of
    retries) per query. ``timeout`` names the client's timeout setting and its value, for the
    message.
    """

    def __init__(
        self, owner: str, url: str, timeout: tuple[str, float] = ("", 0.0), limit: int = BREAKER_LIMIT
    ) -> None:
        self.owner, self.url, self.limit = owner, url, limit
        self.timeout_setting, self.timeout_s = timeout
        self.in_a_row = 0
        self.silent = 0  # of those, tries that connected and got no response
        self.last_error = ""
        self._lock = threading.Lock()

    @property
    def open(self) -> bool:
        return self.in_a_row >= self.limit

    def failed(self, error: str, *, silent: bool = False) -> bool:
        """One more try that got no response (``silent``: connected, then nothing within the
        timeout; else could not connect); True when the breaker is now open."""
        with self._lock:
            self.in_a_row += 1
            self.silent += silent
            self.last_error = error
            return self.in_a_row >= self.limit

    def succeeded(self) -> None:
        """The endpoint answered (whatever its status): the count starts again."""
        with self._lock:
            self.in_a_row = self.silent = 0

    def message(self) -> str:
        """The one line that stops the run: the owner, the URL and what the last tries met."""
        if not self.silent:
            return (
                f"{self.owner} endpoint {self.url} is unreachable: {self.in_a_row} connection attempts in a "
                f"row failed ({self.last_error}); the run stops. Is the service running at that address?"
            )
        within = f" within {self.timeout_s:g} s ({self.timeout_setting})" if self.timeout_setting else ""
        return (
            f"{self.owner} endpoint {self.url} does not answer: {self.in_a_row} requests in a row got no "
            f"response{within} ({self.last_error}); the run stops. Is the service hung or overloaded? "
            f"(If it is only slow, raise {self.timeout_setting or 'its timeout'}.)"
        )
