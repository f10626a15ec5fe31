"""The metric registry and the one naming rule used everywhere.

A metric is registered once by its *base* name (``"recall"``). A concrete metric
name adds the cutoff when the metric takes one::

    recall_at_5      records, JSON, MLflow keys (the canonical name)
    recall@5         terminal tables only (``display_name``); also accepted as input
    intent_top1      metrics without a cutoff are just the base name

Names may carry a prefix such as a split or slice (``"dev/recall_at_5"``);
``display_name`` and ``direction_of`` keep / ignore everything up to the last
``/``. ``parse_metric_name`` takes a bare metric name only.

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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from rag_ablate.core.errors import ConfigError, UnknownNameError
from rag_ablate.core.registry import Registry

__all__ = [
    "REGISTRY",
    "MetricSpec",
    "direction_of",
    "display_name",
    "metric_name",
    "parse_metric_name",
    "register",
    "split_prefix",
    "valid_metric_names",
]

Direction = Literal["higher", "lower"]

_BASE_RE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
_AT_K_RE = re.compile(r"(?P<base>.+?)(?:_at_|@)(?P<k>[0-9]+)")
_KIND = "metric"


@dataclass(frozen=True)
class MetricSpec:
    """What the rest of the tool needs to know about one metric.

    ``base`` is lower snake case and must not contain ``"_at_"`` (that separates
    the cutoff). ``binary`` means every per-query value is 0 or 1, so paired
    flips between variants are exact counts. ``takes_k`` means the metric is
    always used with a cutoff (``recall_at_5``), never bare.
    """

    base: str
    direction: Direction
    binary: bool
    takes_k: bool
    description: str

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
        if not isinstance(self.binary, bool) or not isinstance(self.takes_k, bool):
            raise ValueError(f"metric {self.base!r}: binary and takes_k must be bools")
        if not isinstance(self.description, str) or not self.description.strip():
            raise ValueError(f"metric {self.base!r}: description must be a non-empty string")

    @property
    def typed_name(self) -> str:
        """The name as a user types it: ``recall_at_<k>`` or ``intent_top1``."""
        return f"{self.base}_at_<k>" if self.takes_k else self.base


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


def _register_builtins() -> None:
    retrieval = {
        "hit": (True, "1 if any relevant document is in the top k unique documents"),
        "recall": (False, "relevant documents in the top k / all relevant documents"),
        "precision": (False, "relevant documents in the top k / k"),
        "mrr": (False, "1 / rank of the first relevant document within the top k, else 0"),
        "ndcg": (False, "DCG / ideal DCG at k; gain 2^grade - 1, discount log2(rank + 1)"),
        "full_recall": (True, "1 if every relevant document is in the top k"),
    }
    for base, (binary, description) in retrieval.items():
        register(MetricSpec(base, "higher", binary, True, description))
    # alternative evidence sets (docs/metrics.md): computed when a query has relevant_sets
    register(
        MetricSpec(
            "set_recall",
            "higher",
            False,
            True,
            "max over relevant_sets of (the set's documents in the top k / its size)",
        )
    )
    register(MetricSpec("set_hit", "higher", True, True, "1 if some relevant set lies wholly in the top k"))
    register(
        MetricSpec(
            "evidence_recall",
            "higher",
            False,
            True,
            "evidence spans overlapped by a top-k chunk of the same document / all spans",
        )
    )
    register(
        MetricSpec(
            "context_tokens",
            "lower",
            False,
            True,
            "tokens of the top k chunks handed to the generator",
        )
    )
    register(
        MetricSpec(
            "intent_top1",
            "higher",
            True,
            False,
            "1 if the predicted leaf intent equals intent_l2",
        )
    )
    # access control (docs/metrics.md "Access control"): security metrics, never folded into quality
    register(
        MetricSpec(
            "acl_leak",
            "lower",
            False,
            True,
            "distinct documents among the top k chunks that the asking user may not see "
            "(allowed_groups sharing none of the query's user_groups)",
        )
    )
    register(MetricSpec("acl_leak_rate", "lower", True, True, "1 if any document in the top k is a leak"))
    register(MetricSpec("latency_ms", "lower", False, False, "end-to-end latency in milliseconds"))
    for q in (50, 95):
        register(
            MetricSpec(
                f"latency_p{q}_ms",
                "lower",
                False,
                False,
                f"{q}th percentile of end-to-end latency over a split's queries, failed ones included "
                "(a statistic of the split: compared by a group bootstrap, not per query)",
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
        )
    )
    # answers (docs/metrics.md "Answers"): computed when a record has an answer
    for spec in (
        MetricSpec("exact_match", "higher", True, False, "1 if the answer's tokens equal a reference's"),
        MetricSpec(
            "token_f1",
            "higher",
            False,
            False,
            "F1 of shared tokens (characters for Chinese, words otherwise), max over references",
        ),
        MetricSpec("refusal", "lower", True, False, "1 if the answer contains a refusal phrase"),
        MetricSpec("correct_refusal", "higher", True, False, "unanswerable queries: 1 if the answer refuses"),
        MetricSpec("over_refusal", "lower", True, False, "answerable queries: 1 if the answer refuses"),
        MetricSpec(
            "citation_precision", "higher", False, False, "citations that support their sentence / citations"
        ),
        MetricSpec(
            "citation_coverage",
            "higher",
            False,
            False,
            "answer sentences with a supporting citation / sentences",
        ),
    ):
        register(spec)
    # judged answers (docs/metrics.md "Judged answers"): computed when an LLM judge ran (judge=openai)
    judged = {
        "faithfulness": "how well the contexts support every claim of the answer",
        "relevance": "how directly the answer addresses the question",
        "completeness": "how much of the reference answer the answer covers (queries with references)",
    }
    for base, what in judged.items():
        register(MetricSpec(base, "higher", False, False, f"LLM judge, 0-5, mean over repeats: {what}"))
        register(
            MetricSpec(
                f"judge_error_{base}",
                "lower",
                False,
                False,
                f"share of the judge's repeats whose {base} judgement failed (unparsable output or a "
                "failed call); its mean is the judge's error rate",
            )
        )


_register_builtins()
