"""The comparison step: is a variant really better than the baseline, where, by how much?

Input is what the jobs left on disk (each job folder's ``records.jsonl``,
``variant.json`` and ``config.yaml``) or in MLflow (the same files as artifacts
of a sweep's child runs), never anything held in memory, so it works after any
launcher and can be rerun at will.

Per split (dev, holdout), per variant against the baseline, per metric: the
effect (variant mean - baseline mean over the paired queries), its 95% interval
by inverting the group sign-flip test, the test's p, the group-bootstrap SE and
percentile interval (secondary), and p adjusted over the split's family
(variants x metrics): Holm on holdout (confirmatory), Benjamini-Hochberg on dev
(exploratory). Failed queries are counted, compared (``error_rate``) and timed
(``latency_ms``), never dropped silently. See docs/statistics.md.

Modules: :mod:`.model` (the data), :mod:`.load` (sweep folder, MLflow),
:mod:`.analysis` (the statistics), :mod:`.gate` (``--fail-on``), :mod:`.render`
(terminal, markdown, json) and :mod:`.run` (the whole step, one function).
"""

from rag_ablate.compare.analysis import (
    DEFAULT_METRICS,
    ERROR_RATE,
    UNBOUNDED,
    USES_FAILED,
    compare,
    delta_metrics,
    value,
)
from rag_ablate.compare.gate import GateRule, gate
from rag_ablate.compare.load import load_mlflow_parent, load_sweep_dir, pick_baseline, read_config
from rag_ablate.compare.model import Comparison, Flip, Pair, Row, VariantData
from rag_ablate.compare.render import format_markdown, format_terminal, table_rows, write_outputs
from rag_ablate.compare.run import ComparisonRun, Source, gate_report, load_source, run_comparison
from rag_ablate.layout import COMPARISON_JSON, COMPARISON_MD

__all__ = [
    "COMPARISON_JSON",
    "COMPARISON_MD",
    "DEFAULT_METRICS",
    "ERROR_RATE",
    "UNBOUNDED",
    "USES_FAILED",
    "Comparison",
    "ComparisonRun",
    "Flip",
    "GateRule",
    "Pair",
    "Row",
    "Source",
    "VariantData",
    "compare",
    "delta_metrics",
    "format_markdown",
    "format_terminal",
    "gate",
    "gate_report",
    "load_mlflow_parent",
    "load_source",
    "load_sweep_dir",
    "pick_baseline",
    "read_config",
    "run_comparison",
    "table_rows",
    "value",
    "write_outputs",
]
