"""Recorded traffic as the system under test (``system=replay``): scored without calling anything.

Each query's trace comes from a log, ``system.path``, in one of three formats (``system.format``):

* ``records``: the ``records.jsonl`` of an earlier run (its job folder or the file). Each record's
  trace (status and error, retrieved chunks, intents, answer, citations, usage, timings) is replayed
  as it was, so the run's metrics are reproduced exactly; a failed query stays failed with its status.
* ``responses``: a JSONL of logged exchanges with a service, one per line::

      {"query_id": "q1", "eval": {...}, "chat": "data: {...}\\n\\n...", "latency_ms": 812.5}

  ``eval`` is the body the eval endpoint answered, ``chat`` the chat endpoint's answer (SSE text, its
  events' data as a list, or null: no answer logged); both are mapped with ``system.response.*`` as a
  live ``system=http`` response would be (:func:`rag_ablate.systems.http.map_logged`), and what does
  not match is the query's ``bad_response``, as live. Optional: ``query`` (the text), ``latency_ms``
  and ``ttft_ms`` (the logged times), ``http_status`` (an error code makes the query fail with the
  status a live call would have had).
* ``mlflow``: the per-query traces rag_ablate logged to MLflow (:mod:`rag_ablate.tracking.traces`) for
  one run (``system.run_id``) or a whole experiment (``system.experiment``), read from the tracking URI
  in ``system.path``: retrieved chunks, predicted intent, answer, timings and failures; citations,
  token usage and time to first token are not in traces, so their metrics are absent.

Lines are joined to the dataset's queries by query id or by query text with whitespace normalised
(``system.join``); a line whose text several queries share answers each of them. When two lines
name one query the later one counts (an interrupted run appends a later attempt). Lines that match
no query are never dropped silently: one summary line on stderr, and each with its line number and
why in ``replay_unmatched.jsonl`` in the job folder (:meth:`ReplaySystem.write_files`). A query with
no line is recorded as failed with status ``not_logged``. A line that cannot be read is a
:class:`ReplayError` naming file, line and field, before any query is scored.

Replay has no latency of its own: a query's times are the log's (records and traces carry them,
``latency_ms`` in a responses line), else absent, never the time replay took; the sweep's
interleaved timing pass skips replay variants (:attr:`ReplaySystem.timed`).
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rag_ablate.config.schema import RunConfig, validate_system
from rag_ablate.core.cache import Cache
from rag_ablate.core.errors import DatasetError
from rag_ablate.core.fsio import write_text_atomic
from rag_ablate.core.layout import RECORDS_FILE, REPLAY_UNMATCHED_FILE
from rag_ablate.core.retry import status_meaning
from rag_ablate.dataset.model import Dataset, Query
from rag_ablate.records.trace import Trace
from rag_ablate.systems import SYSTEMS
from rag_ablate.systems.base import OnDone
from rag_ablate.systems.http import CallFailure, map_logged


class ReplayError(DatasetError):
    """A line of a replayed log cannot be read (``file``, ``line`` and ``field`` say where)."""


def normalise(text: str) -> str:
    """A query text as ``system.join=query`` compares it: runs of whitespace made one space, trimmed."""
    return " ".join(text.split())


@dataclass
class Logged:
    """One usable line of the log: where it is, what it joins on, and how its trace is made."""

    line: int
    key: str  # the query id, or the normalised query text
    trace: Callable[[Query], Trace]  # the line's trace for a query it matched
    answered: bool  # the line carries an answer (or a logged answer call)
    routed: bool  # the line carries a predicted intent


@dataclass
class Unmatched:
    """A line that scored no query (a line of ``replay_unmatched.jsonl``)."""

    line: int
    key: str
    reason: str


@SYSTEMS.register("replay")
class ReplaySystem:
    """A log of what a system did, replayed query by query: the BatchSystem contract, no calls."""

    timed = False  # nothing to time: the sweep's interleaved timing pass skips replay variants

    def __init__(self, settings: RunConfig, cache: Cache | None = None) -> None:
        validate_system(settings.system)
        self.s = settings
        self.cfg = settings.system
        self.traces: dict[str, Trace] = {}
        self.unmatched: list[Unmatched] = []
        self.source = ""  # the log as the messages name it
        self.n_lines = 0
        self.not_logged = 0  # queries of the dataset with no line
        self._dataset_name = ""
        self._routed = False
        self._answered = False

    @property
    def routes_intents(self) -> bool:
        """The log's system predicted intents (intent metrics are then computed, as in its run)."""
        return self._routed

    @property
    def generates_answers(self) -> bool:
        """The log's system answered (a failed query then misses the answer metrics, as in its run)."""
        return self._answered

    def prepare(self, dataset: Dataset) -> dict[str, Any]:
        """Read the whole log and join it to ``dataset``; raises ReplayError on an unreadable line."""
        by_key: dict[str, list[Query]] = {}
        for q in dataset.queries:
            key = q.query_id if self.cfg.join == "query_id" else normalise(q.query)
            by_key.setdefault(key, []).append(q)
        readers = {"records": self._records, "responses": self._responses, "mlflow": self._mlflow}
        chosen: dict[str, Logged] = {}  # query id -> the line that answers it (the last one)
        superseded: set[int] = set()  # lines a later line for the same query replaced
        self.unmatched, self.n_lines = [], 0
        for item in readers[self.cfg.format](dataset):
            self.n_lines += 1
            queries = by_key.get(item.key)
            if not queries:
                field = "query id" if self.cfg.join == "query_id" else "query text"
                self.unmatched.append(
                    Unmatched(item.line, item.key, f"no query of dataset '{dataset.name}' has this {field}")
                )
                continue
            for q in queries:
                earlier = chosen.get(q.query_id)
                if earlier is not None and earlier.line not in superseded:  # once per line
                    superseded.add(earlier.line)
                    self.unmatched.append(
                        Unmatched(earlier.line, earlier.key, f"superseded by line {item.line} (same query)")
                    )
                chosen[q.query_id] = item
        self.traces = {
            q.query_id: _named(chosen[q.query_id].trace(q), q.query_id)
            for q in dataset.queries
            if q.query_id in chosen
        }
        lines = {id(item): item for item in chosen.values()}.values()  # each line that scored a query
        self._answered = any(item.answered for item in lines)
        self._routed = any(item.routed for item in lines)
        self.unmatched.sort(key=lambda u: u.line)
        self.not_logged = len(dataset.queries) - len(self.traces)
        self._dataset_name = dataset.name
        return {
            "replay.source": self.source,
            "replay.lines": self.n_lines,
            "replay.unmatched_lines": len(self.unmatched),
            "replay.not_logged": self.not_logged,
        }

    def write_files(self, folder: Path) -> None:
        """``replay_unmatched.jsonl`` in the job folder when a line scored no query, and one summary
        line on stderr when a line scored no query or a query had no line."""
        if not (self.unmatched or self.not_logged):
            return
        scored = self.n_lines - len(self.unmatched)
        parts = [f"replay: {scored} of {self.n_lines} lines of {self.source} scored a query"]
        if self.unmatched:
            path = folder / REPLAY_UNMATCHED_FILE
            rows = [{"line": u.line, "key": u.key, "reason": u.reason} for u in self.unmatched]
            write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            shown = ", ".join(str(u.line) for u in self.unmatched[:10]) + (", ..." if len(rows) > 10 else "")
            which = f"line{'s' if len(rows) > 1 else ''} {shown}"
            parts.append(f"{len(rows)} did not ({which}; listed with why in {path})")
        if self.not_logged:
            parts.append(
                f"{self.not_logged} queries of dataset '{self._dataset_name}' have no line "
                "(recorded as failed: not_logged)"
            )
        print("; ".join(parts), file=sys.stderr)

    def run(self, query: Query) -> Trace:
        """The logged trace of ``query`` (a copy), or a ``not_logged`` failure without times."""
        trace = self.traces.get(query.query_id)
        if trace is None:
            field = "id" if self.cfg.join == "query_id" else "text"
            return Trace(
                query.query_id,
                status="not_logged",
                error=f"replay: no line of {self.source} has this query's {field}",
            )
        return copy.deepcopy(trace)

    def run_many(self, queries: Sequence[Query], on_done: OnDone) -> None:
        """Every query's logged trace, in order: the runner adds no time of its own (replay has none)."""
        for q in queries:
            on_done(q, self.run(q))

    def close(self) -> None:
        """Nothing to release."""

    # ------------------------------------------------------------------ the formats

    def _file(self, name: str | None) -> Path:
        """The log file: ``system.path``, or ``name`` in it when it is a folder (a run's folder)."""
        path = Path(self.cfg.path or "")
        if path.is_dir() and name is not None:
            path = path / name
        if not path.is_file():
            raise ReplayError(f"no such file (system.path, system.format={self.cfg.format})", file=str(path))
        self.source = str(path)
        return path

    def _key(self, obj: Mapping[str, Any], where: tuple[str, int]) -> str:
        """The line's join key (``system.join``): its query id, or its normalised query text."""
        field = self.cfg.join
        value = obj.get(field)
        if field == "query_id" and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str) or not value.strip():
            hint = (
                " (records without text: privacy.store_text=false; join by query_id)"
                if field == "query"
                else ""
            )
            raise ReplayError(
                f"a non-empty string is required to join on (system.join={field}){hint}",
                file=where[0],
                line=where[1],
                field=field,
            )
        return value if field == "query_id" else normalise(value)

    def _records(self, dataset: Dataset) -> Iterator[Logged]:
        path = self._file(RECORDS_FILE)
        for line, rec in _json_lines(path):
            key = self._key(rec, (str(path), line))
            trace = _record_trace(rec, str(path), line)
            metrics = rec.get("metrics")
            routed = bool(trace.intents) or trace.intent_pred is not None
            routed = routed or (isinstance(metrics, Mapping) and "intent_top1" in metrics)
            yield Logged(line, key, _fixed(trace), trace.answer is not None, routed)

    def _responses(self, dataset: Dataset) -> Iterator[Logged]:
        path = self._file(None)
        routed = self.cfg.response.intents is not None  # as system=http: the mapping says
        for line, obj in _json_lines(path):
            where = (str(path), line)
            key = self._key(obj, where)
            if "eval" not in obj:
                raise ReplayError(
                    "no 'eval': the eval endpoint's logged body", file=where[0], line=line, field="eval"
                )
            times = {f: _number(obj, f, where) for f in ("latency_ms", "ttft_ms")}
            code = obj.get("http_status")
            if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
                raise ReplayError(
                    f"an HTTP status code is an integer, got {code!r}",
                    file=where[0],
                    line=line,
                    field="http_status",
                )

            def trace(
                q: Query,
                obj: Mapping[str, Any] = obj,
                line: int = line,
                times: dict[str, float | None] = times,
                code: int | None = code,
            ) -> Trace:
                return self._exchange(q, obj, line, times, code, dataset)

            yield Logged(line, key, trace, obj.get("chat") is not None, routed)

    def _exchange(
        self,
        query: Query,
        obj: Mapping[str, Any],
        line: int,
        times: Mapping[str, float | None],
        code: int | None,
        dataset: Dataset,
    ) -> Trace:
        """One logged exchange as a trace: mapped as a live response, failing as a live call would."""
        meaning = None if code is None else status_meaning(code)
        if meaning is not None:
            trace = Trace(
                query.query_id,
                status=meaning[0],
                error=f"{self.source}:{line}: logged HTTP {code}",
                http_status=code,
            )
        else:
            try:
                trace = map_logged(self.s, query, obj["eval"], obj.get("chat"), documents=dataset.documents)
                trace.http_status = code
            except CallFailure as exc:  # the failure a live call would have had: its status, where it is
                trace = Trace(
                    query.query_id,
                    status=exc.status,
                    error=f"{self.source}:{line}: {exc}",
                    http_status=code,
                )
        if times["latency_ms"] is not None:
            trace.timings_ms["total"] = times["latency_ms"]
        trace.ttft_ms = times["ttft_ms"]
        return trace

    def _mlflow(self, dataset: Dataset) -> Iterator[Logged]:
        from rag_ablate.tracking.traces import read_traces

        uri = self.cfg.path or ""
        self.source = f"MLflow {uri} " + (
            f"run {self.cfg.run_id}" if self.cfg.run_id else f"experiment '{self.cfg.experiment}'"
        )
        for n, rec in enumerate(
            read_traces(uri, run_id=self.cfg.run_id, experiment=self.cfg.experiment), start=1
        ):
            key = self._key(rec, (self.source, n))
            trace = _record_trace(rec, self.source, n)
            yield Logged(n, key, _fixed(trace), trace.answer is not None, trace.intent_pred is not None)


def _fixed(trace: Trace) -> Callable[[Query], Trace]:
    """A line's trace whatever query it matched (records and MLflow traces are complete already)."""
    return lambda _query: trace


def _named(trace: Trace, query_id: str) -> Trace:
    """``trace`` under the dataset's query id (a line joined by text may name another)."""
    return trace if trace.query_id == query_id else replace(trace, query_id=query_id)


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line; ReplayError for a line that is not a JSON object."""
    with path.open(encoding="utf-8") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError as exc:
                raise ReplayError(f"not JSON ({exc})", file=str(path), line=line) from exc
            if not isinstance(obj, dict):
                raise ReplayError(
                    f"a line is a JSON object, got {type(obj).__name__}", file=str(path), line=line
                )
            yield line, obj


def _number(obj: Mapping[str, Any], field: str, where: tuple[str, int]) -> float | None:
    value = obj.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ReplayError(
            f"a number of milliseconds >= 0, got {value!r}", file=where[0], line=where[1], field=field
        )
    return float(value)


_TRACE_FIELDS = (
    "status",
    "error",
    "retrieved",
    "intent_pred",
    "intent_score",
    "timings_ms",
    "intents",
    "answer",
    "citations",
    "usage",
    "usage_count",
    "cached",
    "ttft_ms",
    "http_status",
    "retries",
)


def _record_trace(rec: Mapping[str, Any], file: str, line: int) -> Trace:
    """The trace of a record (or a trace read from MLflow); ReplayError naming the first field that
    cannot be read."""
    try:
        return Trace.from_dict(rec)
    except (KeyError, TypeError, ValueError) as first:
        for field in _TRACE_FIELDS:  # which field: each tried alone
            try:
                Trace.from_dict({"query_id": rec.get("query_id"), field: rec.get(field)})
            except (KeyError, TypeError, ValueError) as exc:
                raise ReplayError(
                    f"not a trace's {field} ({type(exc).__name__}: {exc})", file=file, line=line, field=field
                ) from exc
        raise ReplayError(f"not a record ({type(first).__name__}: {first})", file=file, line=line) from first
