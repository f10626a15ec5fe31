"""Per-query results as MLflow traces, where MLflow users look for them.

Each selected query of a variant becomes one MLflow trace linked to the variant's
run: a root span ``query`` whose inputs are ``{query_id, query}`` (identical across
variants, so MLflow's Evaluation runs view pairs the rows of two runs query by
query), with child spans ``route``, ``retrieve`` (a RETRIEVER span whose outputs
are the retrieved chunks as MLflow documents), ``rerank`` and ``generate`` (when
the system answered). The spans replay the measured stage timings of the record:
stage durations are laid out one after another from the query's start (stages that
ran at the same time, such as an HTTP system's eval and chat calls, all start there),
and the queries one after another from the start of the evaluation, in dataset
order. Durations are measured; positions are a replay (queries an HTTP system sent
concurrently overlapped in fact).

With ``privacy.store_text=false`` the traces carry ids only (inputs ``{query_id}``, empty
passages, no answer); with ``privacy.redact=true`` every text in them is redacted
(:mod:`rag_ablate.core.privacy`).

Every per-query metric of the record that the comparison tests
(``compare.metrics``) is attached as a Feedback assessment from a CODE source (the
quality axes named so that MLflow shows them first: :func:`shown_first`), the gold
documents are the trace's metadata ``gold_doc_ids``, and the query set is the run's
dataset input.

Everything comes from the run's final records (what ``records.jsonl``, the primary data, holds),
picked in the process that has them (:func:`trace_set`), so that only the traced queries cross to the
background writer that logs them (:func:`log_trace_set`) while the run is still being scored.
Writing goes straight to the tracking store in batches: the spans of up to
:data:`BATCH` traces in one ``log_spans`` call and each trace with its assessments
in one ``start_trace`` call, instead of one database round trip per span and per
assessment (MLflow's span-by-span export); on a sqlite store each batch is one transaction
(:func:`rag_ablate.tracking.store.in_one_transaction`), one commit instead of one per trace.
See the MLflow section of README.md for what it costs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rag_ablate.core.errors import ConfigError
from rag_ablate.metrics.registry import direction_of, quality_axes

if TYPE_CHECKING:
    from mlflow.entities import Assessment, Span, TraceInfo

    from rag_ablate.core.privacy import Privacy
    from rag_ablate.dataset.model import Dataset, Query
    from rag_ablate.records.trace import Record

TRACE_NAME = "query"
SOURCE_ID = "rag_ablate"  # the CODE source of every feedback
VARIANT_KEY = "variant"  # the trace tag and metadata naming the variant (a column of MLflow's trace list)
GOLD_NAME = "gold_doc_ids"  # trace metadata: the relevant documents, most relevant first (a JSON list)
BATCH = 100  # traces whose spans are written in one call
STAGES = ("route", "retrieve", "rerank", "generate")  # child spans, in the order they ran
# the stage of a timing key; any other key without a dot is first-stage retrieval (encode,
# bm25, dense, fuse, an HTTP system's eval call, a new retriever's own name); keys with a dot
# (``service.<stage>``: a service's own timings, inside a call) are kept on the root span only
_STAGE_OF = {"route": "route", "rerank": "rerank", "generate": "generate", "chat": "generate"}

NEGATED = " (negated, up = better)"  # the suffix of a lower-is-better metric's feedback name
DESCRIPTION_NOTE = (
    "Per-query traces: one evaluation run per split under this run (its name says which queries: "
    "all of the split, or a sample stratified by kind), compared with the baseline's run of the same "
    "split query by query; its means are the split's means over those queries. MLflow colours every "
    "increase green, so a lower-is-better metric (latency, tokens, errors, access-control leaks, "
    f"refusals) is sent negated, named '<metric>{NEGATED}': green is better for every metric."
)


def lower_is_better(metric: str) -> bool:
    """True when the metric registry says smaller values are better (``MetricSpec.direction``).

    ``metric`` is a registered name (``acl_leak_at_10``, ``dev/latency_ms``); anything else raises
    :class:`~rag_ablate.core.errors.UnknownNameError` listing the valid names.
    """
    return direction_of(metric) == "lower"


FIRST = "#"  # ``#1 token_f1``: a feedback MLflow shows first (its place among the quality axes)


def shown_first(quality_metric: str = "auto") -> list[str]:
    """The metrics whose feedback MLflow's per-query view shows first, in this order: the configured
    quality axis (``compare.quality_metric``), then the automatic quality axes by rank
    (``MetricSpec.quality_axis``: token_f1, exact_match, recall_at_5), so that among the metrics a
    pair of runs carries the sweep's quality axis comes first.

    MLflow 3.17 picks at most 10 default columns in that view, its own 5 or 6, then the feedback in
    the order of their names, and lays the feedback out in that order too (``localeCompare``): so
    these go as ``#1 <metric>``, ``#2 <metric>``... (their place here), which sort before any
    letter, the same in every job of a sweep."""
    configured = [] if quality_metric in ("", "auto") else [quality_metric]
    return list(dict.fromkeys([*configured, *quality_axes()]))


def feedback(metric: str, value: float, first: Sequence[str] = ()) -> tuple[str, float]:
    """The name and value a per-query metric is sent to MLflow as.

    MLflow's evaluation views colour every increase green and every decrease red, and cannot be
    told a metric's direction; so a lower-is-better metric (``MetricSpec.direction``) is sent
    negated, under a name that says so: its improvement is an increase there too. A metric among
    ``first`` (:func:`shown_first`) is prefixed with :data:`FIRST` and its place there."""
    name = metric
    if lower_is_better(metric):
        name, value = f"{metric}{NEGATED}", -value
    if metric in first:
        name = f"{FIRST}{list(first).index(metric) + 1} {name}"
    return name, value


def metric_of(name: str) -> str:
    """The metric a feedback name stands for (:func:`feedback`): ``#3 recall_at_5`` -> recall_at_5,
    ``latency_ms (negated, up = better)`` -> latency_ms."""
    if name.startswith(FIRST):
        name = name.partition(" ")[2]
    return name.removesuffix(NEGATED)


def description_note() -> str:
    """The sentence a variant run's description carries when per-query traces are logged."""
    return DESCRIPTION_NOTE


def parse_setting(value: object) -> int | None:
    """``tracking.traces`` as a number of queries per split: 0 for ``none``, None for ``all``.

    Raises ConfigError for anything else (a negative number, an unknown word).
    """
    if isinstance(value, bool):
        raise ConfigError(f"tracking.traces must be none, all or a number of queries per split, got {value}")
    if isinstance(value, int):
        n = value
    else:
        text = str(value).strip().lower()
        if text in ("none", "null", "false", "off", "0", ""):
            return 0
        if text == "all":
            return None
        try:
            n = int(text)
        except ValueError:
            raise ConfigError(
                f"tracking.traces must be none, all or a number of queries per split, got '{value}'"
            ) from None
    if n < 0:
        raise ConfigError(f"tracking.traces must be >= 0 queries per split, got {n}")
    return n


@dataclass(frozen=True)
class SplitSample:
    """Which queries of one split are traced: ``n`` of its ``total``, all or a sample stratified by kind."""

    split: str
    n: int
    total: int

    @property
    def sampled(self) -> bool:
        return self.n < self.total

    def describe(self) -> str:
        """What the per-query view of this split holds, as its run name and the printed link say."""
        if not self.sampled:
            return f"all {self.total} queries"
        return f"{self.n} of {self.total} queries, a sample stratified by kind"


def select(records: Sequence[Record], per_split: int | None, seed: int = 0) -> list[tuple[int, Record]]:
    """(position, record) of the traced queries, in dataset order: every query of a split with at
    most ``per_split`` queries (None: every split whole), else ``per_split`` of them, a sample
    stratified by ``kind`` (each kind's share as in the split, largest remainders rounded up) drawn
    by a hash of ``seed`` and the query id, so every variant of a dataset traces the same queries."""
    by_split: dict[str, list[int]] = {}
    for i, rec in enumerate(records):
        by_split.setdefault(str(rec.get("split")), []).append(i)
    keep: set[int] = set()
    for positions in by_split.values():
        if per_split is None or len(positions) <= per_split:
            keep.update(positions)
        else:
            keep.update(_stratified(records, positions, per_split, seed))
    return [(i, records[i]) for i in sorted(keep)]


def _stratified(records: Sequence[Record], positions: list[int], n: int, seed: int) -> list[int]:
    strata: dict[str, list[int]] = {}
    for i in positions:
        strata.setdefault(str(records[i].get("kind")), []).append(i)
    exact = {k: n * len(v) / len(positions) for k, v in strata.items()}
    take = {k: int(x) for k, x in exact.items()}
    # the places left go to the largest remainders (ties: the kind's name)
    for k in sorted(exact, key=lambda k: (take[k] - exact[k], k))[: n - sum(take.values())]:
        take[k] += 1

    def order(i: int) -> str:
        return hashlib.sha256(f"{seed}:{records[i]['query_id']}".encode()).hexdigest()

    return [i for k, members in strata.items() for i in sorted(members, key=order)[: take[k]]]


def samples(records: Sequence[Record], chosen: Sequence[tuple[int, Record]]) -> list[SplitSample]:
    """Per split (in dataset order), how many of its queries ``chosen`` holds."""
    total: dict[str, int] = {}
    for rec in records:
        total[str(rec.get("split"))] = total.get(str(rec.get("split")), 0) + 1
    n: dict[str, int] = {}
    for _, rec in chosen:
        n[str(rec.get("split"))] = n.get(str(rec.get("split")), 0) + 1
    return [SplitSample(split, n[split], total[split]) for split in total if split in n]


@dataclass(frozen=True)
class Stage:
    name: str
    start_ms: float  # offset from the query's start
    duration_ms: float
    parts: dict[str, float]  # the timing keys that make up this stage


def stage_layout(timings_ms: Mapping[str, float], *, answered: bool) -> list[Stage]:
    """The child spans of a query: its stages with their recorded durations, one after another.

    ``retrieve`` sums the first-stage timing keys (``encode``, ``bm25``, ``dense``,
    ``fuse``, an HTTP system's ``eval`` call, ...), ``generate`` is ``generate`` or an
    HTTP system's ``chat`` call; ``total`` and nested keys (``service.<stage>``) are not
    stages. A stage the record has no timing for is left out (``generate`` also when
    there is no answer). When the stages add up to more than ``total`` they ran at the
    same time, and all start at the query's start.
    """
    parts: dict[str, dict[str, float]] = {name: {} for name in STAGES}
    for key, value in timings_ms.items():
        if key == "total" or "." in key:
            continue
        parts[_STAGE_OF.get(key, "retrieve")][key] = float(value)
    kept = [(n, parts[n]) for n in STAGES if parts[n] and not (n == "generate" and not answered)]
    total = timings_ms.get("total")
    # stages that add up to more than the query took ran at the same time (an HTTP system
    # sends its eval and chat calls together, each timed from the query's start)
    together = total is not None and sum(sum(p.values()) for _, p in kept) > float(total) * 1.001 + 1e-6
    out = []
    offset = 0.0
    for name, p in kept:
        duration = sum(p.values())
        out.append(Stage(name, offset, duration, p))
        if not together:
            offset += duration
    return out


def query_starts_ns(records: Sequence[Record], start_ns: int) -> list[int]:
    """Each query's start: queries ran one after another from ``start_ns``."""
    out = []
    t = start_ns  # integer nanoseconds: a float has 256 ns steps at today's epoch
    for rec in records:
        out.append(t)
        t += _ms_to_ns(float((rec.get("timings_ms") or {}).get("total", 0.0)))
    return out


def _ms_to_ns(ms: float) -> int:
    return round(ms * 1e6)


def documents(rec: Record, dataset: Dataset, privacy: Privacy | None = None) -> list[dict[str, Any]]:
    """The record's retrieved chunks in MLflow's document shape (page_content, metadata, id).

    With ``privacy`` (:mod:`rag_ablate.core.privacy`) the passage is as it may be stored: empty
    without ``store_text``, redacted with ``redact``."""
    out = []
    for r in rec.get("retrieved") or []:
        doc = None if r["doc_id"] is None else dataset.documents.get(r["doc_id"])
        text = doc.text[r["start"] : r["end"]] if doc is not None else ""
        if privacy is not None:
            text = privacy.text(text) or ""
        meta = {k: r[k] for k in ("doc_id", "chunk_id", "start", "end", "score", "rank")}
        out.append({"page_content": text, "metadata": meta, "id": r["chunk_id"]})
    return out


@functools.cache
def _resource() -> Any:
    """OpenTelemetry's default resource, built once per process: a span built without one builds
    it anew (its detectors run: 0.3 ms a span); the same immutable value either way."""
    from opentelemetry.sdk.resources import Resource

    return Resource.create({})


class _SpanFactory:
    """Finished MLflow spans with explicit ids and times (no tracer, nothing exported)."""

    def __init__(self, trace_id: str, otel_trace_id: int, rng: random.Random) -> None:
        self.trace_id = trace_id
        self.otel_trace_id = otel_trace_id
        self.rng = rng

    def make(
        self,
        name: str,
        span_type: str,
        start_ns: int,
        end_ns: int,
        *,
        parent: int | None,
        inputs: Any,
        outputs: Any,
        attributes: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> tuple[Span, int]:
        from mlflow.entities import Span
        from mlflow.tracing.constant import SpanAttributeKey
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

        span_id = self.rng.getrandbits(64) or 1
        context = SpanContext(self.otel_trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1))
        parent_ctx = (
            None
            if parent is None
            else SpanContext(self.otel_trace_id, parent, is_remote=False, trace_flags=TraceFlags(1))
        )
        attrs = {
            SpanAttributeKey.REQUEST_ID: _dump(self.trace_id),
            SpanAttributeKey.SPAN_TYPE: _dump(span_type),
            SpanAttributeKey.INPUTS: _dump(inputs),
            SpanAttributeKey.OUTPUTS: _dump(outputs),
            **{k: _dump(v) for k, v in (attributes or {}).items()},
        }
        status = Status(StatusCode.ERROR, error) if error else Status(StatusCode.OK)
        otel = ReadableSpan(
            name=name,
            context=context,
            parent=parent_ctx,
            resource=_resource(),
            attributes=attrs,
            start_time=start_ns,
            end_time=end_ns,
            status=status,
        )
        return Span(otel), span_id


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


Usd = Callable[["Record"], tuple[float, float]]  # a query's (input, output) cost in USD


def usage_and_cost(rec: Record, usd: Usd | None) -> tuple[dict[str, int], dict[str, float]]:
    """A query's tokens and money in MLflow's shapes: ``mlflow.chat.tokenUsage`` (``input_tokens``:
    the prompt tokens the system reported, ``output_tokens``: completion tokens, ``total_tokens``:
    as reported, else their sum) and ``mlflow.llm.cost`` (``input_cost``, ``output_cost``,
    ``total_cost`` in USD, from ``usd``). The same keys, as trace metadata, are what MLflow's
    overview sums into "Token Usage" and "Total Cost". Empty when not reported / not priced."""
    usage: Mapping[str, Any] = rec.get("usage") or {}  # looked up by field name
    tokens: dict[str, int] = {}
    for key, field in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")):
        if usage.get(field) is not None:
            tokens[key] = int(usage[field])
    total = usage.get("total_tokens")
    if total is not None or tokens:
        tokens["total_tokens"] = int(total) if total is not None else sum(tokens.values())
    if usd is None or not usage:
        return tokens, {}
    spent_in, spent_out = usd(rec)
    return tokens, {"input_cost": spent_in, "output_cost": spent_out, "total_cost": spent_in + spent_out}


def build_trace(
    rec: Record,
    query: Query | None,
    docs: list[dict[str, Any]],
    *,
    experiment_id: str,
    run_id: str,
    start_ns: int,
    metrics: Sequence[str],
    rng: random.Random,
    variant: str | None = None,
    usd: Usd | None = None,
    model: str | None = None,
    first: Sequence[str] = (),
) -> tuple[TraceInfo, list[Span]]:
    """One query's trace: its info (with feedback and the gold documents) and its finished spans.

    ``rec`` is the stored record (:mod:`rag_ablate.core.privacy`): without a ``query`` (text not
    stored) the inputs are ``{query_id}`` only; ``docs`` are its retrieved chunks as
    :func:`documents` gives them (passages as privacy lets them be stored). ``variant`` (the
    variant's label) goes to the trace's tags and metadata; the tokens the system reported and,
    with ``usd`` (the query's input and output cost), its money go where MLflow's overview and
    trace list read them (:func:`usage_and_cost`); ``model`` (the ``cost.model`` it is billed at)
    is the span's ``mlflow.llm.model``, by which MLflow's overview breaks the cost down; ``first``:
    the metrics whose feedback goes first (:func:`feedback`).

    The gold documents are trace metadata, not an Expectation: MLflow 3.17's per-query view shows
    every expectation before the feedback, and at 1600 px that column pushed the first feedback
    (the headline metric) out of the window."""
    from mlflow.entities import (
        AssessmentSource,
        AssessmentSourceType,
        Feedback,
        SpanType,
        TraceInfo,
        TraceLocation,
        TraceState,
    )
    from mlflow.tracing.constant import (
        TRACE_SCHEMA_VERSION,
        TRACE_SCHEMA_VERSION_KEY,
        AssessmentMetadataKey,
        SpanAttributeKey,
        TraceMetadataKey,
        TraceTagKey,
    )

    otel_trace_id = rng.getrandbits(128) or 1
    trace_id = f"tr-{otel_trace_id:032x}"
    factory = _SpanFactory(trace_id, otel_trace_id, rng)
    timings = rec.get("timings_ms") or {}
    answer = rec.get("answer")
    stages = stage_layout(timings, answered=answer is not None)
    total_ms = float(timings.get("total", 0.0))
    end_ms = max([total_ms] + [st.start_ms + st.duration_ms for st in stages])
    failed = rec.get("status") != "ok"
    error = str(rec.get("error") or "failed") if failed else None
    tokens, money = usage_and_cost(rec, usd)
    spent: dict[str, Any] = {SpanAttributeKey.CHAT_USAGE: tokens} if tokens else {}
    if money:
        spent[SpanAttributeKey.LLM_COST] = money
        if model is not None:
            spent[SpanAttributeKey.MODEL] = model

    # the query's text as stored: absent with privacy.store_text=false (ids only)
    text_in: dict[str, Any] = {"query": rec["query"]} if rec.get("query") is not None else {}
    root_inputs = {"query_id": rec["query_id"], **text_in}
    # the answer first: MLflow's Response column shows the start of this JSON
    root_outputs: dict[str, Any] = {} if answer is None else {"answer": answer}
    root_outputs["doc_ids"] = [d["metadata"]["doc_id"] for d in docs]
    root_outputs["intent"] = rec.get("intent_pred")
    if failed:
        root_outputs["error"] = error
    root, root_id = factory.make(
        TRACE_NAME,
        SpanType.CHAIN,
        start_ns,
        start_ns + _ms_to_ns(end_ms),
        parent=None,
        inputs=root_inputs,
        outputs=root_outputs,
        attributes={
            "rag_ablate.split": rec.get("split"),
            "rag_ablate.kind": rec.get("kind"),
            "rag_ablate.status": rec.get("status"),  # what system=replay restores (format=mlflow)
            "rag_ablate.timings_ms": timings,
            # the model's tokens and money: on the generate span when there is one
            **({} if any(st.name == "generate" for st in stages) else spent),
        },
        error=error,
    )
    spans = [root]
    reranked = any(st.name == "rerank" for st in stages)
    for st in stages:
        s0 = start_ns + _ms_to_ns(st.start_ms)
        s1 = start_ns + _ms_to_ns(st.start_ms + st.duration_ms)
        attrs: dict[str, Any] = {"rag_ablate.timings_ms": st.parts}
        inputs: Any = dict(text_in)
        outputs: Any
        if st.name == "route":
            span_type = SpanType.UNKNOWN
            outputs = {"intent": rec.get("intent_pred"), "score": rec.get("intent_score")}
        elif st.name == "retrieve":
            span_type = SpanType.RETRIEVER
            outputs = docs
            # records keep the final list only: with a reranker it is the reranked one
            attrs["rag_ablate.documents"] = "after rerank" if reranked else "retrieved"
        elif st.name == "rerank":
            span_type = SpanType.RERANKER
            outputs = docs
        else:
            span_type = SpanType.LLM
            inputs = {**text_in, "context_chunk_ids": [d["id"] for d in docs]}
            outputs = {"answer": answer}
            attrs.update(spent)
        span, _ = factory.make(
            st.name, span_type, s0, s1, parent=root_id, inputs=inputs, outputs=outputs, attributes=attrs
        )
        spans.append(span)

    source = AssessmentSource(source_type=AssessmentSourceType.CODE, source_id=SOURCE_ID)
    values = rec.get("metrics") or {}
    assessments: list[Assessment] = []
    for name in metrics:
        v = values.get(name)
        if v is None:
            continue
        meta = {
            AssessmentMetadataKey.SOURCE_RUN_ID: run_id,
            "direction": "lower_is_better" if lower_is_better(name) else "higher_is_better",
            "metric": name,
        }
        sent, value = feedback(name, float(v), first)
        assessments.append(Feedback(name=sent, value=value, source=source, trace_id=trace_id, metadata=meta))
    relevant = (query.relevant if query is not None else None) or {}
    gold = sorted(relevant, key=lambda d: (-relevant[d], d))

    info = TraceInfo(
        trace_id=trace_id,
        trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=start_ns // 1_000_000,
        execution_duration=_ms_to_ns(end_ms) // 1_000_000,
        state=TraceState.ERROR if failed else TraceState.OK,
        request_preview=_dump(root_inputs),
        response_preview=_dump(root_outputs),
        trace_metadata={
            TRACE_SCHEMA_VERSION_KEY: str(TRACE_SCHEMA_VERSION),
            TraceMetadataKey.SOURCE_RUN: run_id,
            TraceMetadataKey.INPUTS: _dump(root_inputs),
            TraceMetadataKey.OUTPUTS: _dump(root_outputs),
            **({TraceMetadataKey.TOKEN_USAGE: json.dumps(tokens)} if tokens else {}),
            **({TraceMetadataKey.COST: json.dumps(money)} if money else {}),
            **({VARIANT_KEY: variant} if variant is not None else {}),
            **({GOLD_NAME: json.dumps(gold)} if gold else {}),
        },
        tags={
            TraceTagKey.TRACE_NAME: TRACE_NAME,
            "rag_ablate.split": str(rec.get("split")),
            **({VARIANT_KEY: variant} if variant is not None else {}),
        },
        assessments=assessments,
    )
    return info, spans


@dataclass(frozen=True)
class QuerySet:
    """The query set as MLflow's dataset input describes it (name, digest, source, schema and
    profile: MLflow keeps no rows), made without MLflow or pandas."""

    name: str
    digest: str
    source: str  # the dataset folder
    schema: str  # MLflow's column-spec JSON
    profile: str  # JSON: rows and cells


def dataset_input(dataset: Dataset, privacy: Privacy | None = None) -> QuerySet:
    """The query set as the dataset input (context ``evaluation``) of every run that holds traces
    (:func:`log_dataset_input`): one row per query with its id, text (as ``privacy`` may store it:
    none without ``store_text``), split, group, kind, intent and gold documents. A column is
    required when no query lacks its value."""
    queries = dataset.queries
    texts_stored = privacy is None or privacy.store_text  # (redacted or not: Privacy.text)
    # name, every value present (a query always has its id, text, split, group and kind), a list of strings
    columns: list[tuple[str, bool, bool]] = [
        ("query_id", True, False),
        ("query", texts_stored, False),
        ("split", True, False),
        ("group", True, False),
        ("kind", True, False),
        ("intent", all(q.intent_l2 is not None for q in queries), False),
        (GOLD_NAME, True, True),
    ]
    spec = [
        {"type": "array", "items": {"type": "string"}, "name": name, "required": required}
        if listed
        else {"type": "string", "name": name, "required": required}
        for name, required, listed in columns
    ]
    return QuerySet(
        name=f"{dataset.name} queries",
        digest=dataset.queries_fingerprint[:36],
        source=str(dataset.path),
        schema=json.dumps({"mlflow_colspec": spec}),
        profile=json.dumps({"num_rows": len(queries), "num_elements": len(queries) * len(columns)}),
    )


def log_dataset_input(uri: str, run_id: str, queries: QuerySet) -> None:
    """:func:`dataset_input`'s query set as the run's dataset input (a local source: the folder)."""
    from mlflow.entities import Dataset as MlflowDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    entity = MlflowDataset(
        name=queries.name,
        digest=queries.digest,
        source_type="local",
        source=json.dumps({"uri": queries.source}),
        schema=queries.schema,
        profile=queries.profile,
    )
    context = InputTag(MLFLOW_DATASET_CONTEXT, "evaluation")
    MlflowClient(tracking_uri=uri).log_inputs(run_id, datasets=[DatasetInput(entity, tags=[context])])


def _run_trace_ids(client: Any, experiment_id: str, run_id: str) -> list[str]:
    ids: list[str] = []
    token = None
    while True:
        page = client.search_traces(
            locations=[experiment_id], run_id=run_id, max_results=500, page_token=token, include_spans=False
        )
        ids.extend(t.info.trace_id for t in page)
        token = page.token
        if not token:
            return ids


@dataclass(frozen=True)
class Traced:
    """One traced query: its stored record, its query in the dataset (None: not there), when it
    started (Unix epoch, ns) and its retrieved chunks (:func:`documents`)."""

    rec: Record
    query: Query | None
    start_ns: int
    docs: list[dict[str, Any]]


@dataclass(frozen=True)
class TraceSet:
    """What the traces of a run are made of, taken from its records and dataset where they are
    (:func:`trace_set`), so that only the traced queries cross to the background writer, not every
    record and the corpus."""

    traced: list[Traced]  # in dataset order
    samples: list[SplitSample]
    queries: QuerySet


def trace_set(
    records: Sequence[Record],
    dataset: Dataset,
    *,
    per_split: int | None,
    start_ns: int,
    seed: int = 0,
    privacy: Privacy | None = None,
) -> TraceSet:
    """The traced queries of ``records`` (:func:`select`; ``per_split``: queries per split, None:
    all) with what their traces show. ``records`` are the stored records; ``start_ns``: when the
    evaluation of the first record began (Unix epoch, nanoseconds); ``privacy`` says what of the
    passages may be stored (:meth:`rag_ablate.core.privacy.Privacy.text`; None: as they are)."""
    chosen = select(records, per_split, seed)
    by_id = {q.query_id: q for q in dataset.queries}
    starts = query_starts_ns(records, start_ns)
    traced = [
        Traced(rec, by_id.get(rec["query_id"]), starts[pos], documents(rec, dataset, privacy))
        for pos, rec in chosen
    ]
    return TraceSet(traced, samples(records, chosen), dataset_input(dataset, privacy))


def log_traces_or_warn(*args: Any, **kwargs: Any) -> int:
    """:func:`log_trace_set`; a failure is said on stderr and 0 returned (traces are a view of
    records.jsonl: the run is kept)."""
    try:
        return log_trace_set(*args, **kwargs)
    except Exception as exc:
        warn_not_logged(exc)
        return 0


def warn_not_logged(exc: Exception) -> None:
    """Say on stderr that the traces were not logged, and why."""
    import sys

    print(f"per-query MLflow traces not logged: {type(exc).__name__}: {exc}", file=sys.stderr)


def log_trace_set(
    uri: str,
    experiment_id: str,
    run_id: str,
    traces: TraceSet,
    *,
    metrics: Iterable[str],
    variant: str | None = None,
    seed: int = 0,
    usd: Usd | None = None,
    model: str | None = None,
    per_split_runs: bool = True,
    first: Sequence[str] = (),
) -> int:
    """Log one trace per query of ``traces`` (:func:`trace_set`); the number of traces logged.
    ``variant``: the name of the run ``run_id`` (None: as MLflow has it now).

    With ``per_split_runs`` (a sweep's job, which has a baseline to compare with; else the traces
    are the run's own), the traces of each split belong to an evaluation run of their own under
    ``run_id`` (the variant's run; :func:`split_run`), named after the variant, the split and which queries it
    holds, so MLflow's Evaluation runs view compares a split of two variants over the same queries
    and its means are that split's; every trace is also linked to ``run_id``.

    ``usd``: a query's money (None: not priced), billed at ``model``. ``first``: the metrics whose
    feedback MLflow shows first (:func:`shown_first`). Also logs the query set as the dataset input
    of each run that holds traces.
    """
    if not traces.traced:
        return 0
    from mlflow.tracing.client import TracingClient
    from mlflow.tracking import MlflowClient

    from rag_ablate.tracking.store import in_one_transaction

    names = list(dict.fromkeys(metrics))
    rng = random.Random(f"{seed}:{run_id}")
    client = TracingClient(uri)
    runs = MlflowClient(tracking_uri=uri)
    if variant is None:
        variant = runs.get_run(run_id).info.run_name
    # a resumed run (resume=) logs its traces again: one trace per query, never two
    old = _run_trace_ids(client, experiment_id, run_id)
    if old:
        client.delete_traces(experiment_id, trace_ids=old)
    for sample in traces.samples:
        target = split_run(uri, experiment_id, run_id, variant, sample) if per_split_runs else run_id
        mine = [t for t in traces.traced if str(t.rec.get("split")) == sample.split]
        for i in range(0, len(mine), BATCH):
            built = [
                build_trace(
                    t.rec,
                    t.query,
                    t.docs,
                    experiment_id=experiment_id,
                    run_id=target,
                    start_ns=t.start_ns,
                    metrics=names,
                    rng=rng,
                    variant=variant,
                    usd=usd,
                    model=model,
                    first=first,
                )
                for t in mine[i : i + BATCH]
            ]

            def write(built: list[tuple[TraceInfo, list[Span]]] = built, target: str = target) -> None:
                # the trace first (one insert with its assessments), then the spans of the whole batch;
                # the other order makes every start_trace merge into a row log_spans created
                for info, _ in built:
                    client.start_trace(info)
                client.log_spans(experiment_id, [s for _, spans in built for s in spans])
                if target != run_id:
                    runs.link_traces_to_run([info.trace_id for info, _ in built], run_id)

            in_one_transaction(uri, write)  # a sqlite store: one commit per batch, not one per trace
        if target != run_id:
            log_dataset_input(uri, target, traces.queries)
            runs.set_terminated(target, status="FINISHED")
    log_dataset_input(uri, run_id, traces.queries)
    return len(traces.traced)


TRACES_KIND = "traces"  # rag_ablate.kind of a split's evaluation run


def split_run(uri: str, experiment_id: str, run_id: str, variant: str, sample: SplitSample) -> str:
    """The evaluation run holding the traces of one split of the variant run ``run_id`` (a child of
    it, ``rag_ablate.kind=traces``); the one a resumed run made before, else a new one. Its name
    says which queries: ``chunk=256 · dev · all 234 queries``."""
    from mlflow.tracking import MlflowClient

    from rag_ablate.tracking.tags import NOTE_TAG, PARENT_TAG

    client = MlflowClient(tracking_uri=uri)
    name = f"{variant} · {sample.split} · {sample.describe()}"
    tags = {
        "rag_ablate.kind": TRACES_KIND,
        "rag_ablate.split": sample.split,
        PARENT_TAG: run_id,
        NOTE_TAG: f"Per-query traces of {variant} on split {sample.split}: {sample.describe()}. "
        + DESCRIPTION_NOTE,
    }
    found = split_runs(uri, experiment_id, run_id).get(sample.split)
    if found is None:
        return str(client.create_run(experiment_id, run_name=name, tags=tags).info.run_id)
    client.update_run(found, status="RUNNING", name=name)
    for key, value in tags.items():
        client.set_tag(found, key, value)
    return found


def split_runs(uri: str, experiment_id: str, run_id: str) -> dict[str, str]:
    """Split -> the evaluation run holding that split's traces of the variant run ``run_id``."""
    from mlflow.tracking import MlflowClient

    from rag_ablate.tracking.tags import PARENT_TAG

    found = MlflowClient(tracking_uri=uri).search_runs(
        [experiment_id],
        filter_string=f"tags.`{PARENT_TAG}` = '{run_id}' and tags.`rag_ablate.kind` = '{TRACES_KIND}'",
    )
    return {str(r.data.tags["rag_ablate.split"]): str(r.info.run_id) for r in found}


def read_traces(uri: str, *, run_id: str | None, experiment: str | None) -> list[dict[str, Any]]:
    """The per-query traces of one run (``run_id``) or of a whole experiment (by name), as
    :func:`build_trace` wrote them, oldest first, each as the part of a record it carries:
    ``query_id``, ``query`` (absent when the text was not stored), ``split``, ``status`` (the
    record's; ``failed`` for an error trace written before traces kept it), ``error``, ``retrieved``
    (the retrieve span's documents), ``intent_pred``, ``answer`` and ``timings_ms``. Raises
    ConfigError for an unknown run or experiment, or when it holds no such trace."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from rag_ablate.core.retry import STATUSES

    client = MlflowClient(tracking_uri=uri)
    where = f"run {run_id}" if run_id else f"experiment '{experiment}'"
    try:
        if run_id:
            experiment_id = client.get_run(run_id).info.experiment_id
        else:
            found = client.get_experiment_by_name(str(experiment))
            if found is None:
                raise ConfigError(f"system.experiment: no experiment '{experiment}' in {uri}")
            experiment_id = found.experiment_id
    except MlflowException as exc:
        raise ConfigError(f"system.run_id: no {where} in {uri} ({exc.message})") from exc
    out: list[dict[str, Any]] = []
    token = None
    while True:
        page = client.search_traces(
            locations=[experiment_id],
            run_id=run_id,
            max_results=500,
            page_token=token,
            order_by=["timestamp_ms ASC"],
        )
        for trace in page:
            spans = {span.name: span for span in trace.data.spans}
            root = spans.get(TRACE_NAME)
            if root is None or not isinstance(root.inputs, dict) or "query_id" not in root.inputs:
                continue  # not a query trace of rag_ablate's
            outputs = root.outputs if isinstance(root.outputs, dict) else {}
            status = root.get_attribute("rag_ablate.status")
            if status not in STATUSES:
                status = "failed" if str(trace.info.state).endswith("ERROR") else "ok"
            retrieve = spans.get("retrieve")
            docs = retrieve.outputs if retrieve is not None and isinstance(retrieve.outputs, list) else []
            rec: dict[str, Any] = {
                **root.inputs,
                "split": root.get_attribute("rag_ablate.split"),
                "status": status,
                "error": outputs.get("error"),
                "retrieved": [d.get("metadata") or {} for d in docs if isinstance(d, dict)],
                "intent_pred": outputs.get("intent"),
                "answer": outputs.get("answer"),
                "timings_ms": root.get_attribute("rag_ablate.timings_ms") or {},
            }
            out.append(rec)
        token = page.token
        if not token:
            break
    if not out:
        raise ConfigError(f"{where} in {uri} has no per-query traces of rag_ablate (tracking.traces=none?)")
    return out


# --------------------------------------------------------------------------- end of a sweep


def compare_link(base: str, experiment_id: str, run_id: str, baseline_run_id: str) -> str:
    """MLflow's Evaluation runs view: ``run_id`` against ``baseline_run_id``, query by query."""
    return (
        f"{base.rstrip('/')}/#/experiments/{experiment_id}/evaluation-runs"
        f"?selectedRunUuid={run_id}&compareToRunUuid={baseline_run_id}"
    )


def append_description(uri: str, run_id: str, text: str) -> None:
    """Add a paragraph to a run's description (``mlflow.note.content``) unless it is there."""
    from mlflow.tracking import MlflowClient

    from rag_ablate.tracking.tags import NOTE_TAG

    client = MlflowClient(tracking_uri=uri)
    current = client.get_run(run_id).data.tags.get(NOTE_TAG, "")
    if text not in current:
        client.set_tag(run_id, NOTE_TAG, f"{current}\n\n{text}" if current else text)


def sweep_links(
    uri: str,
    experiment_id: str,
    summaries: Sequence[Mapping[str, Any]],
    baseline: str | None,
    base: str,
) -> list[str]:
    """At the end of a sweep with traces: one line per variant and split with its compare link,
    which compares the variant's evaluation run of that split with the baseline's (the same queries).

    Also appends :data:`DESCRIPTION_NOTE` to the description of every traced variant run (once).
    ``baseline`` is the baseline's label; without a baseline run that has traces there is nothing
    to compare against and nothing is returned.
    """
    from mlflow.tracking import MlflowClient

    traced = [s for s in summaries if s.get("run_id") and int(s.get("traces") or 0) > 0]
    base_run = next((str(s["run_id"]) for s in traced if s.get("label") == baseline), None)
    if base_run is None:
        return []
    client = MlflowClient(tracking_uri=uri)
    base_splits = split_runs(uri, experiment_id, base_run)
    lines = []
    for s in traced:
        run_id = str(s["run_id"])
        if run_id == base_run:
            continue
        append_description(uri, run_id, DESCRIPTION_NOTE)
        for split, split_run_id in sorted(split_runs(uri, experiment_id, run_id).items()):
            if split not in base_splits:
                continue
            which = str(client.get_run(split_run_id).info.run_name).rsplit(" · ", 1)[-1]
            link = compare_link(base, experiment_id, split_run_id, base_splits[split])
            lines.append(f"per-query {s['label']} vs {baseline}, {split} ({which}): {link}")
    return lines
