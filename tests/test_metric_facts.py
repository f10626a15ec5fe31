"""Every fact about a metric lives on its registry entry, and nothing else keeps a list of metrics.

* No module outside ``rag_ablate/metrics/`` (the registry and the family modules that compute
  metrics) holds a literal tuple, list or set of two or more metric names: every such list
  derives from the registry (an AST scan of the package).
* The lists that used to be kept by hand (the default ``compare.metrics`` and ``metrics.summary``,
  the judge's metrics, the human-labelled ones, the quality axes) come out of the registry as
  they were.
* A metric registered at run time, and nothing else changed, is compared (a row, flips, the
  terminal table and comparison.md), traced with its direction, and reported as undocumented
  until docs/metrics.md names it.
* Every lower-is-better metric is lower-is-better in the MLflow trace feedback.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_ablate.compare.analysis import compare, family_of
from rag_ablate.compare.model import VariantData
from rag_ablate.compare.render import format_terminal, write_outputs
from rag_ablate.core.errors import ConfigError, UnknownNameError
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset
from rag_ablate.judges import JUDGE_METRICS
from rag_ablate.metrics.registry import (
    REGISTRY,
    MetricSpec,
    auto_quality,
    bases_where,
    default_compare_metrics,
    default_summary_metrics,
    human_metrics,
    judged_metrics,
    metrics_where,
    parse_metric_name,
    quality_axes,
    register,
    split_prefix,
)
from rag_ablate.tracking import traces as mt
from tests.conftest import write_dataset
from tests.test_docs import undocumented_metrics

PACKAGE = Path(__file__).resolve().parents[1] / "rag_ablate"
HOME = PACKAGE / "metrics"  # the registry and the family modules: where metric names belong

# literals that look like lists of metrics but are not, each with the reason
NOT_METRIC_LISTS = {
    # usd_per_1k, the percentile of cost.query_latency_ms and cost.final_context_tokens: names of
    # rag_ablate.run.cost's cost/ section, tried in order for compare.cost_metric=auto
    ("compare/tradeoff.py", "AUTO_COSTS"),
}


def _metric_like(text: str) -> bool:
    """A registered base (``context_tokens``) or a metric name built from one (``recall_at_5``,
    ``recall@5``, ``dev/latency_ms``)."""
    if text in REGISTRY:
        return True
    try:
        parse_metric_name(split_prefix(text)[1])
    except (UnknownNameError, ConfigError):
        return False
    return True


def metric_lists(source: str) -> list[tuple[int, str, list[str]]]:
    """(line, name assigned to, metric names) of every tuple/list/set literal in ``source`` that holds
    two or more metric-like strings, and of every dict literal keyed by two or more metric names
    only; the name is ``""`` outside an assignment."""
    tree = ast.parse(source)
    owner: dict[int, str] = {}
    for node in ast.walk(tree):  # breadth first: the outermost assignment of a literal wins
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            name = next((t.id for t in targets if isinstance(t, ast.Name)), "")
            for sub in ast.walk(node.value):
                owner.setdefault(id(sub), name)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            names = [
                e.value
                for e in node.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str) and _metric_like(e.value)
            ]
            if len(names) >= 2:
                found.append((node.lineno, owner.get(id(node), ""), names))
        elif isinstance(node, ast.Dict):  # keyed by metric: every key a metric name
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            if len(keys) >= 2 and len(keys) == len(node.keys) and all(map(_metric_like, keys)):
                found.append((node.lineno, owner.get(id(node), ""), keys))
    return sorted(found)


def test_the_scan_finds_lists_of_metric_names_and_nothing_else() -> None:
    source = (
        'A = ("recall_at_5", "latency_ms")\n'
        "def f(m):\n"
        '    return m in {"faithfulness", "acl_leak"}\n'
        'B = ("dev", "holdout", "recall_at_5")\n'  # one metric name is not a list of them
        'C: list[str] = ["recall@5", "dev/ndcg_at_10", "context_tokens"]\n'
        'D = ("recall_at_0", "recal_at_5", "ndcg")\n'  # no cutoff, a typo and a bare base of an @k metric
        'E = {"latency_p50_ms": 50.0, "latency_p95_ms": 95.0}\n'
        'F = {"scores": {}, "refusal": None, "latency_ms": 1.0}\n'  # a record's fields, not metrics
    )
    assert metric_lists(source) == [
        (1, "A", ["recall_at_5", "latency_ms"]),
        (3, "", ["faithfulness", "acl_leak"]),
        (5, "C", ["recall@5", "dev/ndcg_at_10", "context_tokens"]),
        (7, "E", ["latency_p50_ms", "latency_p95_ms"]),
    ]


def test_no_module_but_the_registry_and_the_family_modules_lists_metric_names() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if HOME in path.parents:
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        for line, owner, names in metric_lists(path.read_text(encoding="utf-8")):
            if (rel, owner) not in NOT_METRIC_LISTS:
                offenders.append(f"rag_ablate/{rel}:{line} {owner or '(literal)'} = {names}")
    assert not offenders, (
        "lists of metric names outside the registry (derive them from rag_ablate.metrics.registry: "
        "metrics_where, default_compare_metrics, judged_metrics, ...):\n" + "\n".join(offenders)
    )


# --------------------------------------------------------------------------- the derived lists


def test_the_derived_lists_are_the_ones_the_modules_used_to_keep() -> None:
    # what config/schema.py (COMPARE_METRICS, metrics.summary), the judges, the dataset module,
    # compare/analysis.py and compare/tradeoff.py kept by hand before the registry held it
    assert set(default_compare_metrics()) == {
        "recall_at_5", "ndcg_at_10", "mrr_at_10", "evidence_recall_at_5", "intent_top1",
        "context_tokens_at_5", "latency_ms", "latency_p50_ms", "latency_p95_ms", "error_rate",
        "acl_leak_at_10", "acl_leak_rate_at_10", "token_f1", "exact_match", "correct_refusal",
        "over_refusal", "citation_precision", "citation_coverage", "faithfulness", "relevance",
        "completeness",
        "chunk_recall_at_5", "chunk_mrr_at_10",  # added with relevant_chunks (gold chunk ids)
        # added with sentence answers, clarifications and the answer's language (issue 26)
        "reference_in_answer", "reference_recall", "correct_clarification", "answer_language_match",
        "evidence_coverage_at_5", "bpref",  # added with issue 26 (judged_at_10: its gap warning)
    }  # fmt: skip
    assert len(default_compare_metrics()) == len(set(default_compare_metrics()))
    assert default_summary_metrics() == [
        "recall_at_5", "ndcg_at_10", "evidence_recall_at_5", "evidence_coverage_at_5", "judged_at_10",
        "intent_top1",
    ]  # fmt: skip
    assert (
        JUDGE_METRICS == judged_metrics() == human_metrics() == ("faithfulness", "relevance", "completeness")
    )
    # latency runs over the queries ok on both sides (a failure's time is reported apart)
    assert set(bases_where(uses_failed=True)) == {"error_rate"}
    # the failure-aware forms: the worst value of a bounded scale; none for unbounded values, the
    # failure itself and the judge's own errors
    no_miss = {s.base for s in metrics_where(miss=None)}
    assert no_miss == {
        "context_tokens", "latency_ms", "latency_p50_ms", "latency_p95_ms", "error_rate", "acl_leak",
        *(f"judge_error_{m}" for m in judged_metrics()),
        *bases_where(family="diagnosis"),  # the failure stages: a failed query is not diagnosed
        "refusal_rule_agreement",  # the phrase rule against the judge: a failed query is not judged
        "judged",  # label coverage: a failed query retrieved nothing to judge
    }  # fmt: skip
    for spec in metrics_where():
        if spec.miss is not None:
            assert spec.bounded and spec.miss == (0.0 if spec.direction == "higher" else 1.0), spec.base
    assert set(bases_where(bounded=False)) == {
        "latency_ms",
        "latency_p50_ms",
        "latency_p95_ms",
        "context_tokens",
    }
    assert {s.base: (s.quantile, s.quantile_of) for s in metrics_where() if s.quantile is not None} == {
        "latency_p50_ms": (50.0, "latency_ms"),
        "latency_p95_ms": (95.0, "latency_ms"),
    }
    assert bases_where(family="timing") == ("latency_ms", "latency_p50_ms", "latency_p95_ms")
    assert [family_of(m) for m in ("latency_p95_ms", "dev/latency_ms", "recall_at_5", "acl_leak_at_10")] == [
        "timing", "timing", "main", "main",
    ]  # fmt: skip
    # quality auto: an answer metric when the records carry one (token_f1 first), else recall@5
    assert quality_axes() == ["token_f1", "exact_match", "recall_at_5"]
    assert auto_quality({"exact_match", "token_f1", "recall_at_5"}) == "token_f1"
    assert auto_quality({"exact_match", "recall_at_5"}) == "exact_match"
    assert auto_quality({"ndcg_at_10"}) == auto_quality(set()) == "recall_at_5"


def test_every_default_list_names_registered_metrics_and_every_judged_one_has_its_error_rate() -> None:
    for name in [*default_compare_metrics(), *default_summary_metrics(), *quality_axes()]:
        parse_metric_name(name)
    for base in judged_metrics():
        err = REGISTRY[f"judge_error_{base}"]
        assert (err.direction, err.family) == ("lower", "judge")


def test_metrics_where_refuses_a_fact_that_is_not_a_field() -> None:
    with pytest.raises(TypeError, match="judgd"):
        metrics_where(judgd=True)
    assert len(metrics_where()) == len(REGISTRY)


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"family": "speed"}, "family"),
        ({"quantile": 90.0}, "quantile_of"),
        ({"quantile": 120.0, "quantile_of": "latency_ms"}, "percentile"),
        ({"default_k": 5}, "takes_k"),
        ({"default_compare": True, "takes_k": True}, "default_k"),
        ({"quality_axis": 1, "takes_k": True}, "default_k"),
        ({"judged": 1}, "bools"),
    ],
)
def test_a_spec_whose_facts_do_not_fit_is_refused(extra: dict[str, Any], why: str) -> None:
    fields: dict[str, Any] = {
        "base": "x",
        "direction": "higher",
        "binary": False,
        "takes_k": False,
        "description": "d",
    }
    with pytest.raises(ValueError, match=why):
        MetricSpec(**{**fields, **extra})


# --------------------------------------------------------------------------- a metric added at run time



def _variants(values: dict[str, tuple[list[float], list[float]]], n: int = 12) -> list[VariantData]:
    """A baseline and a variant over ``n`` holdout queries, one group each, with these metric values."""

    def records(side: int) -> list[dict[str, Any]]:
        return [
            {
                "query_id": f"q{i}",
                "query": f"question {i}",
                "split": "holdout",
                "group": f"g{i}",
                "kind": "answerable",
                "status": "ok",
                "metrics": {m: v[side][i] for m, v in values.items()},
            }
            for i in range(n)
        ]

    return [VariantData("baseline", records(0)), VariantData("v", records(1))]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return load_dataset(write_dataset(tmp_path_factory.mktemp("facts") / "d"))


def _feedback_directions(dataset: Dataset, metrics: dict[str, float]) -> dict[str, str]:
    """The direction the MLflow trace code gives each metric's Feedback on one query's trace."""
    from mlflow.entities import Feedback

    q = dataset.queries[0]
    rec = {
        "query_id": q.query_id,
        "query": q.query,
        "split": q.split,
        "kind": q.kind,
        "status": "ok",
        "answer": None,
        "timings_ms": {"bm25": 0.5, "total": 1.0},
        "retrieved": [
            {"rank": 1, "chunk_id": "FEES#0", "doc_id": "FEES", "start": 0, "end": 50, "score": 3.5}
        ],
        "metrics": metrics,
    }
    info, _ = mt.build_trace(
        rec,
        q,
        mt.documents(rec, dataset),
        experiment_id="0",
        run_id="r",
        start_ns=0,
        metrics=list(metrics),
        rng=random.Random(0),
    )
    feedback = [a for a in info.assessments if isinstance(a, Feedback)]
    # a lower-is-better metric goes negated, under a name that says so (MLflow paints increases green)
    for a in feedback:
        assert (a.name, a.value) == mt.feedback(a.metadata["metric"], metrics[a.metadata["metric"]])
        assert a.name.endswith(mt.NEGATED) == (a.metadata["direction"] == "lower_is_better")
    return {a.metadata["metric"]: a.metadata["direction"] for a in feedback}


def test_a_metric_registered_at_run_time_is_compared_rendered_traced_and_must_be_documented(
    scratch_registry: None, dataset: Dataset, tmp_path: Path
) -> None:
    # the family module would compute it per query; here the records carry it
    register(
        MetricSpec(
            "pii_leak",
            "lower",
            True,
            False,
            "1 if the answer repeats another user's personal details",
            family="security",
            default_compare=True,
        )
    )
    base_leaks = [1.0] * 8 + [0.0] * 4
    variants = _variants({"pii_leak": (base_leaks, [0.0] * 12), "recall_at_5": ([1.0] * 12, [1.0] * 12)})
    assert "pii_leak" in default_compare_metrics()

    c = compare(variants, splits=["holdout"], B=5000, seed=0)  # the default metrics: the registry's
    assert "pii_leak" in c.metrics
    row = c.row("holdout", "v", "pii_leak")
    assert row is not None and row.direction == "lower" and row.family == "main"
    assert row.effect == pytest.approx(-8 / 12)
    assert row.p_exact and row.p_value == pytest.approx(2 / 2**8)  # 8 non-zero paired differences
    assert row.significant and row.verdict == "better"  # fewer leaks is better
    flips = c.flips["v"]["pii_leak"]["holdout"]
    assert len(flips["improved"]) == 8 and not flips["regressed"]  # binary: every change is a flip

    assert any(line.split()[:2] == ["v", "pii_leak"] for line in format_terminal(c).splitlines())
    _, md = write_outputs(c, tmp_path)
    assert any(line.startswith("| v | pii_leak |") for line in md.read_text(encoding="utf-8").splitlines())

    assert _feedback_directions(dataset, {"pii_leak": 1.0, "recall_at_5": 0.5}) == {
        "pii_leak": "lower_is_better",
        "recall_at_5": "higher_is_better",
    }
    assert undocumented_metrics() == ["pii_leak"]  # tests/test_docs.py fails until metrics.md names it


def test_a_percentile_registered_at_run_time_is_compared_as_a_statistic_of_the_split(
    scratch_registry: None,
) -> None:
    register(
        MetricSpec(
            "latency_p90_ms",
            "lower",
            False,
            False,
            "90th percentile of end-to-end latency",
            family="timing",
            uses_failed=True,
            bounded=False,
            quantile=90.0,
            quantile_of="latency_ms",
        )
    )
    rng = np.random.default_rng(3)
    base = list(rng.uniform(10, 20, 40))
    var = [x + 5.0 for x in base]
    c = compare(
        _variants({"latency_ms": (base, var)}, n=40), metrics=["latency_p90_ms"], splits=["holdout"], B=500
    )
    row = c.row("holdout", "v", "latency_p90_ms")
    assert row is not None and row.family == "timing" and row.direction == "lower"
    assert row.baseline_mean == pytest.approx(np.percentile(base, 90))
    assert row.effect == pytest.approx(5.0)


# --------------------------------------------------------------------------- trace directions


def test_every_lower_is_better_metric_is_lower_is_better_in_the_trace_feedback(dataset: Dataset) -> None:
    names = {(f"{s.base}_at_3" if s.takes_k else s.base): s.direction for s in metrics_where()}
    got = _feedback_directions(dataset, dict.fromkeys(names, 1.0))
    assert got == {n: f"{d}_is_better" for n, d in names.items()}
    # the metrics the old substring heuristic painted higher-is-better (more leaks shown green)
    for name in (
        "acl_leak_at_3",
        "acl_leak_rate_at_3",
        "over_refusal",
        "refusal",
        "judge_error_faithfulness",
        "judge_error_relevance",
        "judge_error_completeness",
    ):
        assert got[name] == "lower_is_better"
    assert mt.lower_is_better("holdout/acl_leak_at_10") and not mt.lower_is_better("dev/recall_at_5")
    with pytest.raises(UnknownNameError):
        mt.lower_is_better("usd_per_1k")  # not a metric: no guess
