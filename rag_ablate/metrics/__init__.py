"""Per-query metrics and the metric registry (definitions: docs/metrics.md).

Importing this package registers the built-in metrics. Canonical names are
``recall_at_5`` / ``intent_top1`` everywhere; ``display_name`` gives ``recall@5``
for terminal tables only.
"""

from rag_ablate.metrics.intent import (
    NO_PREDICTION,
    IntentReport,
    IntentRow,
    intent_report,
    intent_top1,
)
from rag_ablate.metrics.registry import (
    REGISTRY,
    MetricSpec,
    direction_of,
    display_name,
    metric_name,
    parse_metric_name,
    register,
    split_prefix,
    valid_metric_names,
)
from rag_ablate.metrics.retrieval import (
    RETRIEVAL_BASES,
    SET_BASES,
    evidence_recall,
    retrieval_metrics,
    set_metrics,
    unique_docs,
)
from rag_ablate.text.count import CJK_RANGES, context_tokens, count_tokens, is_cjk_text

__all__ = [
    "CJK_RANGES",
    "NO_PREDICTION",
    "REGISTRY",
    "RETRIEVAL_BASES",
    "SET_BASES",
    "IntentReport",
    "IntentRow",
    "MetricSpec",
    "context_tokens",
    "count_tokens",
    "direction_of",
    "display_name",
    "evidence_recall",
    "intent_report",
    "intent_top1",
    "is_cjk_text",
    "metric_name",
    "parse_metric_name",
    "register",
    "retrieval_metrics",
    "set_metrics",
    "split_prefix",
    "unique_docs",
    "valid_metric_names",
]
