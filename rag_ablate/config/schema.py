"""Typed schemas behind every config group.

``conf/config.yaml`` starts its defaults list with ``rag_ablate_schema`` (the
:class:`RunConfig` below, registered in Hydra's ConfigStore), so every YAML option
is merged into a typed node: a misspelt key or a string where a number belongs
fails at composition time, naming the key.

One group per ablation axis: ``system``, ``dataset``, ``chunk``, ``retrieval``, ``rerank``,
``router``, ``tracking``, plus ``experiment`` for named studies. Each dataclass
field carries one comment saying what it means.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rag_ablate.config.ranges import (
    AT_LEAST_0,
    AT_LEAST_1,
    FINITE,
    OPEN_SHARE,
    POSITIVE,
    Count,
    Count0,
    NonNeg,
    OneOf,
    Positive,
    Range,
    Share,
    check_ranges,
)
from rag_ablate.core.errors import ConfigError
from rag_ablate.core.secrets import hide_userinfo

BM25_METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")  # bm25s's scoring variants
REPLAY_FORMATS = ("records", "responses", "mlflow")  # what system=replay reads (system.format)


AUTO = "auto"  # a system=http endpoint or mapping path left to system.shape (rag_ablate.config.shapes)


@dataclass
class HttpResponseConfig:
    """Where system=http finds each field in a response: dotted paths (``data.hits``, ``choices.0.id``).

    ``auto`` (every field's default) takes the path of ``system.shape``'s preset
    (:mod:`rag_ablate.config.shapes`); a null path means the service does not report it.
    ``retrieved``, ``intents`` and ``timings`` are read from the JSON of ``system.eval_path``;
    ``doc_id`` .. ``text`` inside each retrieved item; ``delta`` .. ``done_data`` from each event
    of ``system.chat_path``; ``answer``, ``citations`` and ``usage`` from the response that carries
    the answer (the stream's events, else the JSON response).
    """

    retrieved: str | None = AUTO  # the list of retrieved items (empty: a miss); null: no evidence reported
    doc_id: str | None = AUTO  # an item's document id
    chunk_id: str | None = AUTO  # an item's chunk id; missing = <doc_id>#<rank-1>
    start: str | None = AUTO  # an item's [start, end) character offsets in the document
    end: str | None = AUTO  # missing offsets: located from `text` in the document, else the whole document
    score: str | None = AUTO  # an item's score; missing = 0
    text: str | None = AUTO  # an item's text
    intents: str | None = AUTO  # intent codes (the first non-empty one is the prediction); may be absent
    timings: str | None = AUTO  # the service's own stage timings, kept as service.<stage>
    answer: str | None = AUTO  # the answer text in a JSON response (shapes without a stream)
    delta: str | None = AUTO  # a stream event's piece of answer text
    done: str | None = AUTO  # a stream's end event: this path is true ({"done": true})
    done_data: str | None = AUTO  # a stream's end event: its data is exactly this text ([DONE])
    citations: str | None = AUTO  # ids or {doc_id, chunk_id, start, end}; may be absent
    usage: str | None = AUTO  # token usage {prompt_tokens, completion_tokens, ...}; may be absent
    # the stages a service may report, in the eval JSON (docs/metrics.md "Stage diagnosis"); null = absent
    rewritten_query: str | None = None  # the rewritten/expanded query the service searched with
    filters: str | None = None  # the filters it applied (an object)
    candidates: str | None = None  # the list before rerank; items mapped like `retrieved`'s
    context: str | None = None  # the chunks given to the model; items mapped like `retrieved`'s (+ text)
    versions: str | None = None  # version tags {index, corpus, prompt, model: strings}


@dataclass
class SystemConfig:
    name: str = "local"  # the system under test: local (rag_ablate's own pipeline) | http | replay
    base_url: str | None = None  # http: the service's root URL, e.g. http://127.0.0.1:8000 (required)
    # http: the shapes the service speaks, a preset of endpoints, body and response paths (README
    # "Evaluate your own RAG service over HTTP"): reference | openai_chat_stream | openai_chat |
    # json_answer | single; rag_ablate.config.shapes
    shape: str = "reference"
    model: str | None = None  # http, openai shapes: the model name their request body sends
    eval_path: str | None = AUTO  # http: the JSON endpoint (evidence, intents; an answer); null = none
    chat_path: str | None = AUTO  # http: the server-sent-events answer endpoint; null = no stream
    headers: dict[str, str] = field(default_factory=dict)  # http: request headers; values never logged
    body: dict[str, Any] = field(default_factory=dict)  # http: request body template; {} = the shape's
    response: HttpResponseConfig = field(default_factory=HttpResponseConfig)  # http: response mappings
    concurrency: Count = 8  # http: queries in flight at once (each sends its eval and chat requests together)
    timeout_s: Positive = 30.0  # http: connect and read timeout of each request, seconds
    retries: Count0 = 3  # http: resends on connect errors, 5xx and 429 (exponential backoff with jitter)
    backoff_s: NonNeg = 0.5  # http: first backoff delay, seconds; doubles per retry (Retry-After wins)
    backoff_max_s: NonNeg = 30.0  # http: the longest wait between two tries, Retry-After included
    # every system: runs of each query, each on its own model-call cache key (the generator's; system=http
    # sends {repeat} to a body template that uses it): the per-query spread, nested in the comparison
    repeats: Count = 1
    max_error_rate: Share = 0.05  # the error budget: a run whose share of failed queries is above it
    # fails (exit 1), local and http alike; queries failed by the generator or reranker count here
    # replay: score recorded traffic without calling anything (rag_ablate/systems/replay.py)
    path: str | None = None  # replay: the log: a run folder or its records.jsonl, a JSONL of logged
    # responses, or (format=mlflow) a tracking URI such as sqlite:///outputs/mlflow.db (required)
    format: Annotated[str, OneOf(*REPLAY_FORMATS)] = "records"  # replay: records | responses | mlflow
    join: Annotated[str, OneOf("query_id", "query")] = "query_id"  # replay: match lines to queries by
    # id, or by query text (whitespace normalised)
    run_id: str | None = None  # replay, format=mlflow: the MLflow run whose traces are replayed
    experiment: str | None = None  # replay, format=mlflow: or every trace of this experiment (by name)


@dataclass
class DatasetConfig:
    name: str | None = None  # label in run names, tags and variant.json; null = the folder's name
    path: str | None = None  # dataset folder (docs/dataset-format.md); null = embedded sample
    # target share of queries in holdout when splits are assigned
    holdout_share: Annotated[float, OPEN_SHARE] = 0.3
    group_threshold: Share = 0.7  # char 4-gram Jaccard at which queries count as near-duplicates
    # production mix: tag -> weight
    slice_weights: Annotated[dict[str, float], AT_LEAST_0] = field(default_factory=dict)
    edge_tags: list[str] = field(default_factory=lambda: ["edge"])  # weigh 0 unless in slice_weights


@dataclass
class ChunkConfig:
    size: Count = 512  # chunk length in units (characters for CJK text, tokens otherwise)
    overlap: Count0 = 64  # units shared by consecutive chunks; must be < size
    unit: Annotated[str, OneOf("auto", "char", "token")] = "auto"  # auto | char | token
    snap: bool = True  # end chunks at a sentence boundary when one lies in the last 30% of the window
    include_title: bool = True  # prefix the document title to every chunk's indexed text


@dataclass
class BM25Config:
    k1: NonNeg = 1.5  # term-frequency saturation
    b: Share = 0.75  # length normalisation
    # bm25s scoring variant: lucene | robertson | atire | bm25l | bm25+
    method: Annotated[str, OneOf(*BM25_METHODS)] = "lucene"
    # auto | zh (jieba) | en (lowercase words, stopwords)
    analyzer: Annotated[str, OneOf("auto", "zh", "en")] = "auto"


@dataclass
class DenseConfig:
    encoder: str = (
        "auto"  # auto (e5-small for Chinese corpora, minilm otherwise) | minilm | e5-small | st:<folder>
    )
    batch_size: Count = 32  # texts per encoder batch
    index: str = "auto"  # auto (exact up to approximate_above chunks, usearch above) | exact | usearch
    approximate_above: Count0 = 1_000_000  # index=auto: chunks above which the approximate HNSW index is used
    build_threads: Count = 1  # usearch build threads (1: the same graph every run; more: faster, varies)


@dataclass
class HybridConfig:
    fusion: str = "rrf"  # rrf (reciprocal rank fusion) | weighted (min-max normalised scores)
    rrf_k: Positive = 60.0  # the RRF constant k in 1 / (k + rank)
    weight: Share = 0.5  # weighted fusion: weight of dense scores (BM25 gets 1 - weight)
    depth_bm25: Count = 50  # candidates taken from BM25 before fusion
    depth_dense: Count = 50  # candidates taken from dense retrieval before fusion


@dataclass
class RetrievalConfig:
    method: str = "bm25"  # bm25 | dense | hybrid
    top_k: Count = 10  # chunks returned per query (without a reranker)
    acl_filter: bool = False  # drop chunks of documents the query's user_groups may not see, before rerank
    bm25: BM25Config = field(default_factory=BM25Config)
    dense: DenseConfig = field(default_factory=DenseConfig)
    hybrid: HybridConfig = field(default_factory=HybridConfig)


@dataclass
class RerankConfig:
    method: str = "none"  # none | biencoder | cross_encoder | http
    top_k: Count = 10  # chunks kept after reranking (the final list)
    candidates: Count = 50  # the first N retrieved chunks handed to the reranker
    encoder: str = "auto"  # biencoder: which encoder re-scores (as retrieval.dense.encoder)
    model_path: str | None = None  # cross_encoder: a local sentence-transformers CrossEncoder folder
    url: str | None = None  # http: the rerank endpoint, e.g. http://127.0.0.1:8080/rerank
    model: str | None = None  # http: model name sent with each request
    timeout: Positive = 30.0  # http: seconds per request
    api_key_env: str | None = None  # http: environment variable holding a bearer token


@dataclass
class GeneratorConfig:
    name: str = "none"  # none (retrieval only) | extractive (no model); rag_ablate.generators
    max_chunks: Count = 3  # extractive: read the sentences of this many top chunks
    max_sentences: Count = 2  # extractive: quote at most this many sentences, each with its [n]
    # extractive: refuse unless a sentence holds more than this share of query terms
    min_support: Annotated[float, Range(0, 1, high_open=True)] = 0.4
    refusal_zh: str = "文档中没有找到这个问题的答案。"  # extractive: the answer when nothing is supported
    refusal_en: str = "The documents do not answer this question."  # the same for non-Chinese queries
    # extractive: a sentence of more tokens (CJK characters, Latin words) is quoted as its best run of
    # clauses (split after ，：) of at most this many; 0 = whole sentences
    max_sentence_tokens: Count0 = 60
    base_url: str | None = None  # openai: the API root, e.g. http://127.0.0.1:8080/v1 (+ /chat/completions)
    model: str | None = None  # openai: the model name sent with each request (and the cost.prices key)
    api_key_env: str | None = None  # openai: NAME of the environment variable holding the key; null = none
    temperature: Annotated[float, Range(0, 2)] = 0.0  # openai: sampling temperature
    max_tokens: Count = 512  # openai: the longest answer, in the model's tokens
    timeout_s: Positive = 60.0  # openai: seconds per request (connect, and between two streamed chunks)
    retries: Count0 = 3  # openai: tries after the first on 429, 5xx and connect errors
    backoff_s: NonNeg = 1.0  # openai: first retry delay, doubling per retry (Retry-After wins)
    backoff_max_s: NonNeg = 30.0  # openai: the longest wait between two tries, Retry-After included
    concurrency: Count = 1  # openai: answers generated at once (queries are retrieved one at a time)
    prompt_en: str = ""  # openai: prompt for English queries; {question} and {contexts} are filled in
    prompt_zh: str = ""  # openai: prompt for Chinese queries (the same placeholders)


@dataclass
class JudgeConfig:
    name: str = "none"  # none (no judge) | openai (any OpenAI-compatible endpoint); rag_ablate.judges
    base_url: str | None = None  # openai: the API root, e.g. http://127.0.0.1:8080/v1 (+ /chat/completions)
    model: str | None = None  # openai: the judge model's name (logged; the cost.prices key of judge tokens)
    api_key_env: str | None = None  # openai: NAME of the environment variable holding the key; null = none
    # openai: sampling temperature (0: the same prompt gets the same verdict)
    temperature: Annotated[float, Range(0, 2)] = 0.0
    max_tokens: Count = 512  # openai: the longest judgement, in the model's tokens
    timeout_s: Positive = 60.0  # openai: seconds per request
    retries: Count0 = 3  # openai: tries after the first on 429, 5xx and connect errors
    backoff_s: NonNeg = 1.0  # openai: first retry delay, doubling per retry (Retry-After wins)
    backoff_max_s: NonNeg = 30.0  # openai: the longest wait between two tries, Retry-After included
    repeats: Count = 1  # judgements per answer, each its own cache entry (repeat index 0..repeats-1)
    seed: Count0 = 0  # the contexts' shuffle: seed + query id, so each query's order is reproducible
    # pointwise (0-5 scores per answer) | pairwise (baseline vs variant, both orders)
    mode: Annotated[str, OneOf("pointwise", "pairwise")] = "pointwise"
    max_contexts: Count = 5  # the judge sees at most this many top contexts (then shuffled)
    json_mode: bool = True  # send response_format {"type": "json_object"} (servers that support it)
    concurrency: Count = 1  # judge calls in flight at once
    max_error_rate: Share = 0.05  # the judge's error budget: a run where a larger share of a judged
    # metric's judgements failed (unparsable replies, failed calls) fails (exit 1)
    prompt_en: str = ""  # pointwise prompt for English questions ({question} {contexts} {references}
    # {answer} {citations} {rubric} {keys})
    prompt_zh: str = ""  # pointwise prompt for Chinese questions (the same placeholders)
    pairwise_en: str = ""  # pairwise prompt ({question} {contexts} {references} {answer_1} {answer_2})
    pairwise_zh: str = ""  # pairwise prompt for Chinese questions
    repair_en: str = ""  # the follow-up message after an unparsable reply ({error} {keys})
    repair_zh: str = ""  # the same for Chinese questions
    citation_en: str = ""  # one cited pair as shown ({i} {sentence} {passage})
    citation_zh: str = ""  # the same for Chinese questions
    none_en: str = "(none)"  # shown where a section is empty (no references, no citations)
    none_zh: str = "（无）"  # the same for Chinese questions
    keys_en: dict[str, str] = field(default_factory=dict)  # what each JSON key of the reply holds
    keys_zh: dict[str, str] = field(default_factory=dict)  # the same for Chinese questions
    rubric_en: dict[str, list[str]] = field(default_factory=dict)  # metric -> 6 lines, levels 0..5
    rubric_zh: dict[str, list[str]] = field(default_factory=dict)  # the same for Chinese questions


@dataclass
class CacheConfig:
    enabled: bool = True  # reuse chunks, BM25 indexes and embeddings across variants and runs
    dir: str | None = None  # null = <paths.output_root>/cache


@dataclass
class RouterConfig:
    method: str = "centroid"  # centroid | nearest (char n-gram TF-IDF over intent texts) | none
    ngram: Count = 2  # character n-gram length of the nearest-neighbour router


@dataclass
class TrackingConfig:
    enabled: bool = True  # false: write records and summaries to disk only
    uri: str | None = None  # MLflow tracking URI; null = sqlite:///<paths.output_root>/mlflow.db
    experiment: str = "rag_ablate"  # MLflow experiment name
    artifact_root: str | None = None  # null = <paths.output_root>/mlartifacts (a server: its own root)
    # per-query MLflow traces: none | all | N (a split of at most N queries whole, else N of it,
    # stratified by kind)
    traces: str = "20"
    timeout_s: Positive = 60.0  # the longest one MLflow call may take, retries included, seconds
    # the port `rag-ablate ui` serves on and printed links point to (README "Look at results in MLflow")
    ui_port: Annotated[int, Range(1, 65535)] = 5000


@dataclass
class ModelPrice:
    prompt: NonNeg = 0.0  # USD per 1M prompt (input) tokens
    completion: NonNeg = 0.0  # USD per 1M completion (output) tokens
    embedding: NonNeg = 0.0  # USD per 1M embedding tokens


@dataclass
class CostConfig:
    model: str | None = None  # the entry of `prices` the system's tokens are billed at; null = no money
    prices: dict[str, ModelPrice] = field(default_factory=dict)  # model name -> USD per 1M tokens
    # stop a run before its uncached model calls (system at cost.model's price, judge at judge.model's)
    # spend more than this many USD; resumable (README "Spend limit"); null = no limit
    max_usd: Annotated[float | None, POSITIVE] = None


@dataclass
class MetricsConfig:
    # cut-offs of the @k metrics
    ks: Annotated[list[int], AT_LEAST_1] = field(default_factory=lambda: [1, 3, 5, 10])
    # columns of the end-of-run table; empty = the metric registry's (MetricSpec.default_summary),
    # filled in by rag_ablate.settings.to_settings
    summary: list[str] = field(default_factory=list)
    # phrases added to the curated refusal and clarification sets (rag_ablate.metrics.refusals,
    # docs/metrics.md "Refusals and clarifications"): an answer containing one (case-insensitive,
    # outside text copied from its passages) refuses / asks back
    refusal_phrases: list[str] = field(default_factory=list)
    clarification_phrases: list[str] = field(default_factory=list)
    # answer_language_match: a text is Chinese when Han characters are at least this share of its
    # Han characters and Latin words
    han_share: Annotated[float, Range(0, 1, low_open=True)] = 0.5
    # a cited chunk supports its sentence above this share of overlap
    citation_support: Annotated[float, Range(0, 1, low_open=True)] = 0.5


@dataclass
class CompareConfig:
    enabled: bool = True  # run the comparison at the end of every multirun
    baseline: str | None = None  # label of the baseline variant; null = the one marked baseline, else job 0
    # an earlier run every variant is compared with instead (README "CI: does this commit regress?"): a run
    # folder, a sweep's job folder, a sweep folder (its baseline) or an MLflow run id; null = this sweep's
    baseline_run: str | None = None
    # tested against the baseline; empty = the metric registry's default set (MetricSpec.default_compare),
    # filled in by rag_ablate.settings.to_settings and by the comparison itself
    metrics: list[str] = field(default_factory=list)
    splits: list[str] = field(default_factory=lambda: ["dev", "holdout"])  # splits tested, each on its own
    B: Annotated[int, Range(100)] = 10_000  # bootstrap resamples (and the sign-flip budget)
    # significance level after adjustment (Holm on holdout, BH on dev)
    alpha: Annotated[float, OPEN_SHARE] = 0.05
    flip_threshold: NonNeg = 0.2  # a continuous metric "flips" when it moves more than this (relative for
    # latency and token counts)
    fail_on: list[str] = field(default_factory=list)  # gate rules, e.g. "holdout/recall_at_5:-0.02"
    quality_metric: str = "auto"  # quality-vs-cost y axis; auto = an answer metric if any, else recall_at_5
    cost_metric: str = "auto"  # x axis; auto = usd_per_1k if priced, else latency_p95_ms, else context_tokens
    # iso-quality view: cheapest variant whose CI bound clears it, e.g. 0.85
    quality_bar: Annotated[float | None, FINITE] = None
    slice_metrics: list[str] = field(default_factory=lambda: ["auto"])  # tested per slice; auto: quality
    min_slice_groups: Count = 6  # a slice with fewer paired groups is listed as too small, not tested


@dataclass
class TimingConfig:
    # after a sweep's jobs, time every variant's queries again, interleaved in randomised blocks, and
    # compare latency on those paired times (rag_ablate.run.timing); false = the jobs' own latencies
    interleave: bool = True
    repeats: Count = 1  # times each query is answered by each variant in the pass (its latency: their median)


@dataclass
class AblationConfig:
    # ofat: baseline + one variant per non-default level | grid: full factorial
    mode: Annotated[str, OneOf("ofat", "grid")] = "ofat"
    dry_run: bool = False  # print the plan (variants, what each changes, job count) and run nothing
    factors: list[str] = field(default_factory=list)  # a study's factors, e.g. "chunk=256,1024"


@dataclass
class PrivacyConfig:
    store_text: bool = True  # false: no passage, query or answer text in any file or MLflow (ids, scores)
    redact: bool = False  # true: e-mails, phones, CN id and card numbers -> [EMAIL].. in stored text


@dataclass
class PathsConfig:
    output_root: str = "outputs"  # sweeps, runs, mlflow.db, artifacts and caches live here


@dataclass
class RunConfig:
    system: SystemConfig = field(default_factory=SystemConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    chunk: ChunkConfig = field(default_factory=ChunkConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    rerank: RerankConfig = field(default_factory=RerankConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)  # how latency is measured for the verdict
    ablation: AblationConfig = field(default_factory=AblationConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)  # what of the text a run stores
    paths: PathsConfig = field(default_factory=PathsConfig)
    seed: Count0 = 0  # seeds splits, grouping and the comparison's resampling
    progress: bool = True  # show progress bars
    resume: str | None = None  # a run or sweep folder to finish: reruns its missing and failed queries


def register_configs() -> None:
    """Register the schema in Hydra's ConfigStore (idempotent): a copy of :func:`_schema`'s config,
    the one :func:`parse_config` merges into, so a run builds it from the dataclasses once."""
    ConfigStore.instance().store(name="rag_ablate_schema", node=_schema())


@functools.cache
def _schema() -> DictConfig:
    """The schema as a config, built once (0.03 s of CPU: a run registers it in Hydra's ConfigStore
    and parses its config into it, a sweep's plan check parses every job). Never changed: Hydra's
    ConfigStore keeps a copy, and a merge copies it."""
    schema = OmegaConf.structured(RunConfig)
    assert isinstance(schema, DictConfig)
    return schema


def parse_config(cfg: DictConfig) -> RunConfig:
    """A composed config as a :class:`RunConfig`: the schema only (``settings.to_settings`` validates too)."""
    keys = [str(k) for k in cfg if k != "hydra"]
    try:
        plain = OmegaConf.to_container(OmegaConf.masked_copy(cfg, keys), resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(_unresolved(exc)) from None
    if not isinstance(plain, dict):
        raise ConfigError("the composed config is not a mapping")
    try:
        merged = OmegaConf.merge(_schema(), plain)  # merge copies the schema: it stays as built
    except OmegaConfBaseException as exc:
        raise ConfigError(f"config does not match the schema: {exc}") from exc
    settings = OmegaConf.to_object(merged)
    if not isinstance(settings, RunConfig):
        raise ConfigError("the composed config does not match the schema")
    return settings


_ENV_MISSING = re.compile(r"Environment variable '([^']*)' not found")


def _unresolved(exc: OmegaConfBaseException) -> str:
    """One line for a value that cannot be resolved: an unset ``${oc.env:VAR}``, a missing key."""
    key = getattr(exc, "full_key", None) or "a setting"
    env = _ENV_MISSING.search(str(exc))
    if env:
        return (
            f"{key}: the environment variable {env.group(1)} is not set (the setting reads "
            f"${{oc.env:{env.group(1)}}}); export it, or give a default: ${{oc.env:{env.group(1)},default}}"
        )
    return f"{key}: cannot be resolved: {str(exc).splitlines()[0]}"


def validate_system(s: SystemConfig) -> None:
    """Ranges of the system settings (the bounds on its fields); system=http needs its base_url (its
    shape, endpoints and paths: :func:`rag_ablate.config.shapes.check_shape`)."""
    check_ranges(s, "system")
    if s.name == "replay":
        validate_replay(s)
    if s.name != "http":
        return
    if not s.base_url:
        raise ConfigError(
            "system=http needs system.base_url, the service's root URL, "
            "e.g. system.base_url=http://127.0.0.1:8000"
        )
    if not s.base_url.startswith(("http://", "https://")):
        shown = hide_userinfo(s.base_url)
        raise ConfigError(f"system.base_url must start with http:// or https://, got '{shown}'")


def validate_replay(s: SystemConfig) -> None:
    """system=replay needs the log: ``system.path`` (an existing file or folder, unless it is an MLflow
    tracking URI) and, for format=mlflow, a run id or an experiment name."""
    if not s.path:
        raise ConfigError(
            "system=replay needs system.path, the log to score: a run folder or its records.jsonl "
            "(system.format=records), a JSONL of logged responses (system.format=responses), or an "
            "MLflow tracking URI (system.format=mlflow)"
        )
    if s.format == "mlflow":
        if not (s.run_id or s.experiment):
            raise ConfigError("system.format=mlflow needs system.run_id or system.experiment (a name)")
        return
    if not Path(s.path).exists():
        raise ConfigError(f"system.path: no such file or folder: {s.path} (system=replay)")
