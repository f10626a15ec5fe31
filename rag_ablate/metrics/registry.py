"""The metric registry and the one naming rule used everywhere.

A metric is registered once by its *base* name (``"recall"``). A concrete metric
name adds the cutoff when the metric takes one::

    recall_at_5      records, JSON, MLflow keys (the canonical name)
    recall@5         terminal tables only (``display_name``); also accepted as input
    intent_top1      metrics without a cutoff are just the base name

Names may carry a prefix such as a split or slice (``"dev/recall_at_5"``);
``display_name`` and ``direction_of`` keep / ignore everything up to the last
``/``. ``parse_metric_name`` takes a bare metric name only.

Every fact about a metric is a field of its :class:`MetricSpec` (direction, scale, family,
failed queries and the failure-aware form's miss, percentile, judged, human-labelled, default
lists, quality axis), and every list of metrics elsewhere is read from here:
:func:`metrics_where` / :func:`bases_where` select by field, :func:`default_compare_metrics`,
:func:`default_summary_metrics`, :func:`quality_axes`, :func:`auto_quality`,
:func:`judged_metrics` and :func:`human_metrics` are the named lists, and :func:`spec_of` looks
one name up. docs/metrics.md "Adding a metric" is the recipe.

Errors:

* an unknown metric, or a name that does not have the shape its metric needs
  (``"recall"`` without a cutoff, ``"intent_top1_at_5"`` with one) raises
  :class:`~rag_ablate.core.errors.UnknownNameError`, whose message lists every valid
  name as it would be typed (``recall_at_<k>``, ``intent_top1``, ...);
* a bad cutoff value (``recall_at_0``, ``recall_at_05``, ``metric_name("recall", 0)``,
  a missing or superfluous k in ``metric_name``) raises
  :class:`~rag_ablate.core.errors.ConfigError`: cutoffs come from the configuration;
* an invalid :class:`MetricSpec` or registering a base twice raises ``ValueError``
  (a programming error in the code that registers it).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Literal

from rag_ablate.core.errors import ConfigError, UnknownNameError
from rag_ablate.core.registry import Registry
from rag_ablate.metrics.stages import OK, STAGES, stage_metric

__all__ = [
    "FAMILIES",
    "REGISTRY",
    "MetricSpec",
    "auto_quality",
    "bases_where",
    "default_compare_metrics",
    "default_summary_metrics",
    "direction_of",
    "display_name",
    "human_metrics",
    "judged_metrics",
    "measured_summary_metrics",
    "metric_name",
    "metric_names_at",
    "metrics_where",
    "parse_metric_name",
    "quality_axes",
    "register",
    "spec_of",
    "split_prefix",
    "stage_metrics",
    "valid_metric_names",
]

Direction = Literal["higher", "lower"]
Family = Literal["quality", "security", "reliability", "cost", "timing", "judge", "diagnosis"]
FAMILIES: tuple[Family, ...] = ("quality", "security", "reliability", "cost", "timing", "judge", "diagnosis")

_BASE_RE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
_AT_K_RE = re.compile(r"(?P<base>.+?)(?:_at_|@)(?P<k>[0-9]+)")
_KIND = "metric"


@dataclass(frozen=True)
class MetricSpec:
    """Every fact the rest of the tool needs about one metric; nothing else keeps a list of them.

    The first five are positional (``MetricSpec("recall", "higher", False, True, "...")``), the
    rest keywords whose defaults fit a plain per-query quality metric:

    ``base``
        lower snake case, never containing ``"_at_"`` (that separates the cutoff).
    ``direction``
        ``"higher"`` or ``"lower"`` is better: the comparison's verdicts, the flips, the
        quality-vs-cost frontier and the MLflow feedback direction all read it.
    ``binary``
        every per-query value is 0 or 1, so paired flips between variants are exact counts.
    ``takes_k``
        always used with a cutoff (``recall_at_5``), never bare.
    ``description``
        one line, shown where the metric is listed.
    ``family``
        ``quality`` (retrieval, intent, answers, judged scores), ``security`` (access-control
        leaks, never folded into quality), ``reliability`` (failed queries), ``cost`` (tokens),
        ``timing`` (read off the clock: adjusted for multiple comparisons in a family of its own,
        so its run-to-run noise never moves another row's adjusted p), ``judge`` (the LLM
        judge's own failures) or ``diagnosis`` (the stage that lost a query,
        :mod:`rag_ablate.metrics.stages`: compared in the comparison's stage section).
    ``uses_failed``
        compared over failed queries too (``error_rate`` is the failure itself); every other
        metric over the queries ``ok`` on both sides (latency included: a failure's time is
        reported apart, so errors that return fast never read as "faster"), or, with a ``miss``,
        in its failure-aware form.
    ``miss``
        the value a failed query scores in the metric's **failure-aware** form, which is what the
        metric's plain name means in aggregates, comparisons, the gate and every headline
        (``recall_at_5``: a failed query that the metric applies to counts as 0 recall); the mean
        over the queries that succeeded is the *ok-only* form, shown beside it. The worst value of
        the metric's scale: 0 for a higher-is-better bounded metric, 1 for a lower-is-better rate
        (``over_refusal``, ``acl_leak_rate``: a failure can never look safer). None: no
        failure-aware form (unbounded values such as latency, tokens or leaked-document counts,
        where no worst value exists, and ``error_rate``, the failure itself).
    ``bounded``
        False for a continuous value without a natural scale (milliseconds, token counts): a
        per-query flip is then judged by relative change, not by an absolute threshold.
    ``quantile``, ``quantile_of``
        a percentile (0-100) of another, per-query metric over a split's queries, compared as a
        statistic of the split instead of a per-query mean (``latency_p95_ms``); both or neither.
    ``judged``
        an LLM judge scores it 0-5 (the judge's rubric has a section per judged metric).
    ``human``
        a dataset's ``human_judgements`` may score it 0-5 (judge calibration).
    ``default_k``
        the cutoff it has in the default lists below (a ``takes_k`` metric in one needs it).
    ``default_compare``
        in the default ``compare.metrics``; ``default_summary``: in the default ``metrics.summary``
        (the end-of-run table; its first column is the headline quality metric).
    ``quality_axis``
        a rank among the automatic quality axes (``compare.quality_metric=auto`` and
        ``compare.slice_metrics=[auto]``): the best-ranked one the records carry, else the
        worst-ranked one (which needs no answers). None: never chosen automatically.
    ``summary_if_measured``
        a column of the end-of-run table, after ``metrics.summary``'s, whenever a variant of the
        table measured it (the answer metrics: no empty column for a retrieval-only run).
    ``warn_gap``, ``warn_text``
        the comparison adds a note (every view shows it) when the baseline's and a variant's
        means of this metric, over the queries both have a value for, differ by more than
        ``warn_gap``; ``warn_text`` says what that means, about the side with the lower mean
        (``judged_at_k``: that side retrieves unlabelled documents). Both or neither.
    """

    base: str
    direction: Direction
    binary: bool
    takes_k: bool
    description: str
    family: Family = "quality"
    uses_failed: bool = False
    bounded: bool = True
    quantile: float | None = None
    quantile_of: str | None = None
    judged: bool = False
    human: bool = False
    default_k: int | None = None
    default_compare: bool = False
    default_summary: bool = False
    quality_axis: int | None = None
    miss: float | None = None
    summary_if_measured: bool = False
    warn_gap: float | None = None
    warn_text: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.base, str) or not _BASE_RE.fullmatch(self.base):
            raise ValueError(
                f"metric base {self.base!r} must be lower snake case (letters, digits, single underscores)"
            )
        if "_at_" in self.base:
            raise ValueError(
                f"metric base {self.base!r} must not contain '_at_' (it separates the cutoff in metric names)"
            )
        if self.direction not in ("higher", "lower"):
            raise ValueError(
                f"metric {self.base!r}: direction must be 'higher' or 'lower', got {self.direction!r}"
            )
        flags = ("binary", "takes_k", "uses_failed", "bounded", "judged", "human", "default_compare",
                 "default_summary", "summary_if_measured")  # fmt: skip
        if not all(isinstance(getattr(self, f), bool) for f in flags):
            raise ValueError(f"metric {self.base!r}: {', '.join(flags)} must be bools")
        if not isinstance(self.description, str) or not self.description.strip():
            raise ValueError(f"metric {self.base!r}: description must be a non-empty string")
        if self.family not in FAMILIES:
            raise ValueError(
                f"metric {self.base!r}: family must be one of {', '.join(FAMILIES)}, got {self.family!r}"
            )
        if (self.quantile is None) != (self.quantile_of is None):
            raise ValueError(f"metric {self.base!r}: quantile and quantile_of go together")
        if self.quantile is not None and (
            isinstance(self.quantile, bool)
            or not isinstance(self.quantile, int | float)
            or not 0 <= self.quantile <= 100
        ):
            raise ValueError(
                f"metric {self.base!r}: quantile must be a percentile in [0, 100], got {self.quantile!r}"
            )
        if self.default_k is not None:
            if not self.takes_k:
                raise ValueError(f"metric {self.base!r}: default_k needs takes_k")
            if isinstance(self.default_k, bool) or not isinstance(self.default_k, int) or self.default_k < 1:
                raise ValueError(
                    f"metric {self.base!r}: default_k must be a positive integer, got {self.default_k!r}"
                )
        listed = self.default_compare or self.default_summary or self.quality_axis is not None
        listed = listed or self.summary_if_measured
        if listed and self.takes_k and self.default_k is None:
            raise ValueError(f"metric {self.base!r}: in a default list with a cutoff, so it needs default_k")
        if self.miss is not None and (
            isinstance(self.miss, bool) or not isinstance(self.miss, int | float) or not self.bounded
        ):
            raise ValueError(f"metric {self.base!r}: miss must be a number, and only for a bounded metric")
        if self.quality_axis is not None and (
            isinstance(self.quality_axis, bool) or not isinstance(self.quality_axis, int)
        ):
            raise ValueError(f"metric {self.base!r}: quality_axis must be an integer rank or None")
        if (self.warn_gap is None) != (self.warn_text is None) or (
            self.warn_gap is not None
            and (
                isinstance(self.warn_gap, bool)
                or not isinstance(self.warn_gap, int | float)
                or self.warn_gap < 0
            )
        ):
            raise ValueError(
                f"metric {self.base!r}: warn_gap (a number >= 0) and warn_text (words) go together"
            )
        if self.warn_text is not None and (not isinstance(self.warn_text, str) or not self.warn_text.strip()):
            raise ValueError(f"metric {self.base!r}: warn_text must be a non-empty string")

    @property
    def typed_name(self) -> str:
        """The name as a user types it: ``recall_at_<k>`` or ``intent_top1``."""
        return f"{self.base}_at_<k>" if self.takes_k else self.base

    @property
    def default_name(self) -> str:
        """The name in the default lists: ``recall_at_5`` (``default_k``) or ``intent_top1``."""
        if not self.takes_k:
            return self.base
        if self.default_k is None:
            raise ValueError(f"metric {self.base!r} has no default_k, so no default name")
        return f"{self.base}_at_{self.default_k}"


# the storage: the project's generic name registry, keyed by base name
_METRICS: Registry[MetricSpec] = Registry(_KIND)


class _ReadOnlyView(Mapping[str, MetricSpec]):
    """A read-only mapping over whatever ``_METRICS`` currently is."""

    def __getitem__(self, base: str) -> MetricSpec:
        if base not in _METRICS:
            raise KeyError(base)
        return _METRICS.get(base)

    def __iter__(self) -> Iterator[str]:
        return iter(_METRICS.names())

    def __len__(self) -> int:
        return len(_METRICS)

    def __repr__(self) -> str:
        return f"REGISTRY({', '.join(_METRICS.names())})"


REGISTRY: Mapping[str, MetricSpec] = _ReadOnlyView()
"""Read-only view of all registered metrics, keyed by base. Add with ``register``."""


def register(spec: MetricSpec) -> None:
    """Add a metric. Registering a base that already exists raises ``ValueError``."""
    if not isinstance(spec, MetricSpec):
        raise TypeError(f"register() takes a MetricSpec, got {type(spec).__name__}")
    if spec.base in _METRICS:
        raise ValueError(f"metric {spec.base!r} is already registered")
    _METRICS.add(spec.base, spec)


def valid_metric_names() -> list[str]:
    """Every registered metric as it would be typed, sorted (``recall_at_<k>``, ...)."""
    return sorted(_METRICS.get(base).typed_name for base in _METRICS.names())


def _unknown(name: str) -> UnknownNameError:
    return UnknownNameError(_KIND, name, valid_metric_names())


def _lookup(base: object) -> MetricSpec | None:
    return _METRICS.get(base) if isinstance(base, str) and base in _METRICS else None


def _spec_of(base: str) -> MetricSpec:
    spec = _lookup(base)
    if spec is None:
        raise _unknown(str(base))
    return spec


def _check_k(spec: MetricSpec, k: object) -> int | None:
    if not spec.takes_k:
        if k is not None:
            raise ConfigError(f"metric '{spec.base}' takes no cutoff k (got k={k!r}); use '{spec.base}'")
        return None
    if k is None:
        raise ConfigError(f"metric '{spec.base}' needs a cutoff k, e.g. '{spec.base}_at_5'")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"metric '{spec.base}': cutoff k must be a positive integer, got {k!r}")
    return k


def metric_name(base: str, k: int | None = None) -> str:
    """The canonical name: ``("recall", 5) -> "recall_at_5"``, ``("intent_top1",) -> "intent_top1"``.

    Unknown base -> ``UnknownNameError``; a missing, superfluous or non-positive
    k -> ``ConfigError``.
    """
    spec = _spec_of(base)
    checked = _check_k(spec, k)
    return spec.base if checked is None else f"{spec.base}_at_{checked}"


_NAMES_AT: dict[tuple[str, tuple[int, ...]], tuple[tuple[int, ...], tuple[str, ...]]] = {}


def metric_names_at(base: str, ks: tuple[int, ...]) -> tuple[str, ...]:
    """:func:`metric_name` of ``base`` at every k of ``ks``, in that order. Remembered for the tuple
    of cutoffs that :func:`rag_ablate.metrics.retrieval.cutoffs` hands out (scoring asks for every
    query) by the tuple's identity, so another tuple (a bool equals its int) is checked."""
    known = _NAMES_AT.get((base, ks))
    if known is not None and known[0] is ks:
        return known[1]
    names = tuple(metric_name(base, k) for k in ks)
    if len(_NAMES_AT) >= 1024:
        _NAMES_AT.clear()
    _NAMES_AT[base, ks] = (ks, names)  # the tuple last asked for is remembered
    return names


def parse_metric_name(name: str) -> tuple[MetricSpec, int | None]:
    """``"recall_at_5"`` or ``"recall@5"`` -> ``(spec, 5)``; ``"intent_top1"`` -> ``(spec, None)``.

    Takes a bare metric name (no ``split/`` prefix). Unknown names, and names
    whose shape does not fit their metric, raise ``UnknownNameError`` listing
    the valid names; a bad cutoff (``recall_at_0``, leading zeros) raises
    ``ConfigError``.
    """
    if not isinstance(name, str):
        raise _unknown(repr(name))
    spec = _lookup(name)
    if spec is not None:
        if spec.takes_k:  # "recall" alone: the cutoff is missing
            raise _unknown(name)
        return spec, None
    match = _AT_K_RE.fullmatch(name)
    if match is None:
        raise _unknown(name)
    spec = _lookup(match["base"])
    if spec is None or not spec.takes_k:
        raise _unknown(name)
    digits = match["k"]
    k = int(digits)
    if k < 1 or str(k) != digits:
        raise ConfigError(
            f"metric name '{name}': cutoff must be a positive integer without "
            f"leading zeros, e.g. '{spec.base}_at_5'"
        )
    return spec, k


def split_prefix(name: str) -> tuple[str, str]:
    """``"dev/recall_at_5"`` -> ``("dev/", "recall_at_5")``; no prefix -> ``("", name)``."""
    prefix, sep, bare = name.rpartition("/")
    return prefix + sep, bare


def display_name(name: str) -> str:
    """Terminal-table form: ``"recall_at_5"`` -> ``"recall@5"``.

    A prefix is kept: ``"dev/recall_at_5"`` -> ``"dev/recall@5"``.
    """
    prefix, bare = split_prefix(name)
    spec, k = parse_metric_name(bare)
    return prefix + (spec.base if k is None else f"{spec.base}@{k}")


def direction_of(name: str) -> Direction:
    """``"higher"`` or ``"lower"`` is better; tolerates a ``split/`` prefix."""
    _, bare = split_prefix(name)
    return parse_metric_name(bare)[0].direction


def spec_of(name: str) -> MetricSpec:
    """The spec of a metric name: ``"recall_at_5"``, ``"recall@5"``, ``"dev/recall_at_5"``.

    Unknown or misshapen names raise as :func:`parse_metric_name` does.
    """
    _, bare = split_prefix(name)
    return parse_metric_name(bare)[0]


_FACTS = frozenset(f.name for f in fields(MetricSpec))


def metrics_where(**facts: object) -> tuple[MetricSpec, ...]:
    """The registered specs whose fields equal ``facts``, in registration order.

    ``metrics_where(judged=True)``, ``metrics_where(family="timing")``; no facts: every spec.
    A fact that is not a :class:`MetricSpec` field raises ``TypeError``.
    """
    unknown = sorted(set(facts) - _FACTS)
    if unknown:
        raise TypeError(f"metrics_where(): {', '.join(unknown)} is not a MetricSpec field")
    specs = (_METRICS.get(base) for base in _METRICS.names())
    return tuple(s for s in specs if all(getattr(s, k) == v for k, v in facts.items()))


def bases_where(**facts: object) -> tuple[str, ...]:
    """The base names of :func:`metrics_where` (``bases_where(judged=True)``)."""
    return tuple(s.base for s in metrics_where(**facts))


def default_compare_metrics() -> list[str]:
    """The default ``compare.metrics``: every ``default_compare`` metric, in registration order."""
    return [s.default_name for s in metrics_where(default_compare=True)]


def default_summary_metrics() -> list[str]:
    """The default ``metrics.summary`` columns (the first is the headline quality metric)."""
    return [s.default_name for s in metrics_where(default_summary=True)]


def measured_summary_metrics() -> list[str]:
    """The end-table columns shown whenever a variant measured them (``summary_if_measured``)."""
    return [s.default_name for s in metrics_where(summary_if_measured=True)]


def quality_axes() -> list[str]:
    """The automatic quality axes, best rank first (``MetricSpec.quality_axis``)."""
    ranked = sorted(
        (s for s in metrics_where() if s.quality_axis is not None), key=lambda s: s.quality_axis or 0
    )
    return [s.default_name for s in ranked]


def auto_quality(present: Collection[str]) -> str:
    """The quality metric ``auto`` means: the best-ranked axis among ``present`` (the metric names
    the records carry), else the worst-ranked axis."""
    axes = quality_axes()
    if not axes:
        raise ValueError("no metric is registered with a quality_axis")
    return next((m for m in axes if m in present), axes[-1])


def judged_metrics() -> tuple[str, ...]:
    """The metrics an LLM judge scores 0-5, in registration order (``MetricSpec.judged``)."""
    return tuple(s.default_name for s in metrics_where(judged=True))


def human_metrics() -> tuple[str, ...]:
    """The metrics a dataset's ``human_judgements`` may score (``MetricSpec.human``)."""
    return tuple(s.default_name for s in metrics_where(human=True))


def _register_builtins() -> None:
    retrieval = {
        "hit": (True, "1 if any relevant document is in the top k unique documents"),
        "recall": (False, "relevant documents in the top k / all relevant documents"),
        "precision": (False, "relevant documents in the top k / k"),
        "mrr": (False, "1 / rank of the first relevant document within the top k, else 0"),
        "ndcg": (False, "DCG / ideal DCG at k; gain 2^grade - 1, discount log2(rank + 1)"),
        "full_recall": (True, "1 if every relevant document is in the top k"),
    }
    # compared by default, at this cutoff; recall@5 is also the first summary column and the quality
    # axis when the records carry no answer metric
    compared = {"recall": 5, "mrr": 10, "ndcg": 10}
    for base, (binary, description) in retrieval.items():
        k = compared.get(base)
        register(
            MetricSpec(
                base,
                "higher",
                binary,
                True,
                description,
                default_k=k,
                default_compare=k is not None,
                default_summary=base in ("recall", "ndcg"),
                quality_axis=3 if base == "recall" else None,
                miss=0.0,
            )
        )
    # alternative evidence sets (docs/metrics.md): computed when a query has relevant_sets
    register(
        MetricSpec(
            "set_recall",
            "higher",
            False,
            True,
            "max over relevant_sets of (the set's documents in the top k / its size)",
            miss=0.0,
        )
    )
    register(
        MetricSpec(
            "set_hit", "higher", True, True, "1 if some relevant set lies wholly in the top k", miss=0.0
        )
    )
    # gold chunk ids (docs/metrics.md "Chunk-level retrieval"): computed when a query has relevant_chunks
    # and every retrieved item carries a chunk id
    chunk_level = {
        "chunk_hit": (True, None, "1 if any relevant_chunks id is among the top k chunks"),
        "chunk_recall": (False, 5, "relevant_chunks ids among the top k chunks / all relevant_chunks ids"),
        "chunk_mrr": (False, 10, "1 / rank of the first relevant_chunks id within the top k chunks, else 0"),
        "chunk_ndcg": (False, None, "nDCG at k over chunk ids, graded by relevant_chunks"),
    }
    for base, (binary, k, description) in chunk_level.items():
        listed = k is not None
        register(
            MetricSpec(
                base, "higher", binary, True, description, default_k=k, default_compare=listed, miss=0.0
            )
        )
    register(
        MetricSpec(
            "evidence_recall",
            "higher",
            False,
            True,
            "evidence spans overlapped by a top-k chunk of the same document / all spans",
            default_k=5,
            default_compare=True,
            default_summary=True,
            miss=0.0,
        )
    )
    # how much of each evidence span's text the top k chunks hold (docs/metrics.md "evidence_coverage")
    register(
        MetricSpec(
            "evidence_coverage",
            "higher",
            False,
            True,
            "share of each evidence span's characters inside the top k chunks, mean over the spans",
            default_k=5,
            default_compare=True,
            default_summary=True,
            miss=0.0,
        )
    )
    # label coverage (docs/metrics.md "judged@k and bpref"): answerable queries with relevant
    register(
        MetricSpec(
            "judged",
            "higher",
            False,
            True,
            "documents with a relevance label (any grade) among the top k unique documents / k",
            default_k=10,
            default_summary=True,
            warn_gap=0.05,
            warn_text="retrieves unlabelled passages: its recall may be understated",
        )
    )
    register(
        MetricSpec(
            "bpref",
            "higher",
            False,
            False,
            "trec_eval bpref: relevant documents ranked above judged non-relevant ones; unlabelled "
            "ones skipped",
            default_compare=True,
            miss=0.0,
        )
    )
    register(
        MetricSpec(
            "intent_top1",
            "higher",
            True,
            False,
            "1 if the predicted leaf intent equals intent_l2",
            default_compare=True,
            default_summary=True,
            miss=0.0,
        )
    )
    register(
        MetricSpec(
            "context_tokens",
            "lower",
            False,
            True,
            "tokens of the top k chunks handed to the generator",
            family="cost",
            bounded=False,
            default_k=5,
            default_compare=True,
        )
    )
    register(
        MetricSpec(
            "latency_ms",
            "lower",
            False,
            False,
            "end-to-end latency in milliseconds (compared over the queries ok on both sides; a failed "
            "query's time is reported apart)",
            family="timing",
            bounded=False,
            default_compare=True,
        )
    )
    for q in (50, 95):
        register(
            MetricSpec(
                f"latency_p{q}_ms",
                "lower",
                False,
                False,
                f"{q}th percentile of end-to-end latency over a split's queries ok on both sides "
                "(a statistic of the split: compared by a group bootstrap, not per query)",
                family="timing",
                bounded=False,
                quantile=float(q),
                quantile_of="latency_ms",
                default_compare=True,
            )
        )
    register(
        MetricSpec(
            "error_rate",
            "lower",
            True,
            False,
            "1 if the query failed (the system raised, timed out or returned an error, or scoring it "
            "failed), else 0; its mean is the share of failed queries",
            family="reliability",
            uses_failed=True,
            default_compare=True,
        )
    )
    # access control (docs/metrics.md "Access control"): security metrics, never folded into quality;
    # rows only when the corpus restricts documents
    register(
        MetricSpec(
            "acl_leak",
            "lower",
            False,
            True,
            "distinct documents among the top k chunks that the asking user may not see "
            "(allowed_groups sharing none of the query's user_groups)",
            family="security",
            default_k=10,
            default_compare=True,
        )
    )
    register(
        MetricSpec(
            "acl_leak_rate",
            "lower",
            True,
            True,
            "1 if any document in the top k is a leak",
            family="security",
            default_k=10,
            default_compare=True,
            miss=1.0,
        )
    )
    # answers (docs/metrics.md "Answers"): computed when a record has an answer; rows only when some
    # variant has answers; token_f1, then exact_match, are the quality axis when present
    for spec in (
        MetricSpec(
            "token_f1",
            "higher",
            False,
            False,
            "F1 of shared tokens (characters for Chinese, words otherwise), max over references",
            default_compare=True,
            quality_axis=1,
            miss=0.0,
        ),
        MetricSpec(
            "exact_match",
            "higher",
            True,
            False,
            "1 if the answer's tokens equal a reference's",
            default_compare=True,
            quality_axis=2,
            miss=0.0,
        ),
        MetricSpec("refusal", "lower", True, False, "1 if the answer contains a refusal phrase", miss=1.0),
        MetricSpec(
            "correct_refusal",
            "higher",
            True,
            False,
            "unanswerable queries: 1 if the answer refuses",
            default_compare=True,
            miss=0.0,
        ),
        MetricSpec(
            "over_refusal",
            "lower",
            True,
            False,
            "answerable queries: 1 if the answer refuses",
            default_compare=True,
            miss=1.0,
        ),
        MetricSpec(
            "citation_precision",
            "higher",
            False,
            False,
            "citations that support their sentence / citations",
            default_compare=True,
            miss=0.0,
        ),
        MetricSpec(
            "citation_coverage",
            "higher",
            False,
            False,
            "answer sentences with a supporting citation / sentences",
            default_compare=True,
            miss=0.0,
        ),
    ):
        register(spec)
    # sentence answers, clarifications and the answer's language (docs/metrics.md "Sentence answers",
    # "Refusals and clarifications", "answer_language_match"): computed when a record has an answer
    for spec in (
        MetricSpec(
            "reference_in_answer",
            "higher",
            True,
            False,
            "answerable queries with a reference: 1 if some reference occurs whole in the answer "
            "(numbers, amounts and dates normalised)",
            default_compare=True,
            miss=0.0,
            summary_if_measured=True,
        ),
        MetricSpec(
            "reference_recall",
            "higher",
            False,
            False,
            "answerable queries with a reference: share of the reference's tokens found in the answer, "
            "max over references",
            default_compare=True,
            miss=0.0,
            summary_if_measured=True,
        ),
        MetricSpec(
            "asked_clarification",
            "lower",
            True,
            False,
            "every answered query: 1 if the answer asks the user back (a clarification phrase)",
            miss=1.0,
        ),
        MetricSpec(
            "correct_clarification",
            "higher",
            True,
            False,
            "queries whose expected_behavior is clarify: 1 if the answer asks the user back",
            default_compare=True,
            miss=0.0,
            summary_if_measured=True,
        ),
        MetricSpec(
            "answer_language_match",
            "higher",
            True,
            False,
            "every answered query whose question has letters: 1 if the answer is in the question's "
            "script (Han or Latin) or has no letters",
            default_compare=True,
            miss=0.0,
            summary_if_measured=True,
        ),
        MetricSpec(
            "refusal_rule_agreement",
            "higher",
            True,
            False,
            "answered queries the LLM judge gave a refusal verdict: 1 if the phrase rule agrees with it",
            family="judge",
        ),
    ):
        register(spec)
    # judged answers (docs/metrics.md "Judged answers"): computed when an LLM judge ran (judge=openai);
    # a person may score the same three in a dataset's human_judgements (judge calibration)
    judged = {
        "faithfulness": "how well the contexts support every claim of the answer",
        "relevance": "how directly the answer addresses the question",
        "completeness": "how much of the reference answer the answer covers (queries with references)",
    }
    for base, what in judged.items():
        register(
            MetricSpec(
                base,
                "higher",
                False,
                False,
                f"LLM judge, 0-5, mean over repeats: {what}",
                judged=True,
                human=True,
                default_compare=True,
                miss=0.0,
            )
        )
        register(
            MetricSpec(
                f"judge_error_{base}",
                "lower",
                False,
                False,
                f"share of the judge's repeats whose {base} judgement failed (unparsable output or a "
                "failed call); its mean is the judge's error rate",
                family="judge",
            )
        )

    # stage diagnosis (docs/metrics.md "Stage diagnosis"): per query 1 for its failure stage, 0 for
    # the others; their means are the stages' shares of the queries diagnosed (failed ones are not)
    for stage in STAGES:
        register(
            MetricSpec(
                stage_metric(stage),
                "higher" if stage == OK else "lower",
                True,
                False,
                f"1 if the query's failure stage is {stage} (over queries that did not fail; not no_rag)",
                family="diagnosis",
            )
        )


def stage_metrics() -> list[str]:
    """The stage-share metrics, in pipeline order (``stage_no_relevant_in_corpus`` .. ``stage_ok``)."""
    return list(bases_where(family="diagnosis"))


_register_builtins()
