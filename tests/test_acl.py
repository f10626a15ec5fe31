"""Access-control leakage: the visibility rule, the leak metrics, the local filter, system=http.

The rule (docs/metrics.md "Access control"): a document without ``allowed_groups`` is visible to
everyone, one with them to users in at least one of them (``[]``: to no one); a query without
``user_groups`` (or with ``[]``) is an anonymous user who sees only unrestricted documents.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_ablate.compare.analysis import compare
from rag_ablate.compare.model import VariantData
from rag_ablate.config.schema import RunConfig
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset, Document
from rag_ablate.metrics.acl import acl_metrics, has_restrictions, may_see
from rag_ablate.metrics.registry import (
    REGISTRY,
    default_compare_metrics,
    direction_of,
    display_name,
    parse_metric_name,
)
from rag_ablate.pipeline.stages import QueryState
from rag_ablate.records.scoring import aggregate, score_record
from rag_ablate.run.runner import evaluate
from rag_ablate.run.summary import summary_rows
from rag_ablate.systems import SYSTEMS
from rag_ablate.systems.local import LocalSystem
from tests.conftest import DOCS, QUERIES, write_dataset

KS = [1, 3, 5, 10]

# --------------------------------------------------------------------------- hand-worked metrics

PUB = Document("PUB", "public text")  # no allowed_groups: everyone
STAFF = Document("STAFF", "staff text", allowed_groups=("staff",))
FIN = Document("FIN", "finance text", allowed_groups=("finance", "staff"))
NOONE = Document("NOONE", "locked text", allowed_groups=())
CORPUS = {d.doc_id: d for d in (PUB, STAFF, FIN, NOONE)}
RANKED = ["STAFF", "PUB", "STAFF", "FIN", "NOONE"]  # chunks' documents, best first; STAFF twice


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        # anonymous: STAFF (ranks 1, 3: counted once), FIN (4) and NOONE (5) are leaks
        (None, {1: 1, 3: 1, 5: 3, 10: 3}),
        ((), {1: 1, 3: 1, 5: 3, 10: 3}),  # an empty list is anonymous too
        (("customer",), {1: 1, 3: 1, 5: 3, 10: 3}),  # a group no document lists: as anonymous
        (("staff",), {1: 0, 3: 0, 5: 1, 10: 1}),  # staff sees STAFF and FIN; NOONE leaks at 5
        (("finance",), {1: 1, 3: 1, 5: 2, 10: 2}),  # FIN visible; STAFF and NOONE leak
        (("customer", "finance"), {1: 1, 3: 1, 5: 2, 10: 2}),  # one shared group suffices
    ],
)
def test_acl_leak_counts_distinct_forbidden_documents_in_the_top_k(
    user: tuple[str, ...] | None, expected: dict[int, int]
) -> None:
    got = acl_metrics(RANKED, CORPUS, user, KS)
    assert got == {
        **{f"acl_leak_at_{k}": float(n) for k, n in expected.items()},
        **{f"acl_leak_rate_at_{k}": float(n > 0) for k, n in expected.items()},
    }


def test_visibility_rule() -> None:
    assert may_see(None, None) and may_see(None, ()) and may_see(None, ["x"])  # unrestricted
    assert not may_see(["staff"], None) and not may_see(["staff"], [])  # anonymous
    assert may_see(["staff", "finance"], ["finance"]) and not may_see(["staff"], ["customer"])
    assert not may_see([], ["staff"])  # allowed_groups [] : no one


@given(
    ranked=st.lists(st.sampled_from(sorted(CORPUS)), max_size=12),
    user=st.one_of(st.none(), st.lists(st.sampled_from(["staff", "finance", "customer"]), max_size=3)),
)
def test_leaks_grow_with_k_and_never_exceed_k_or_the_forbidden_documents(
    ranked: list[str], user: list[str] | None
) -> None:
    m = acl_metrics(ranked, CORPUS, user, KS)
    forbidden = {d for d in CORPUS if not may_see(CORPUS[d].allowed_groups, user)}
    previous = 0.0
    for k in KS:
        n = m[f"acl_leak_at_{k}"]
        assert previous <= n <= min(k, len(forbidden))
        assert m[f"acl_leak_rate_at_{k}"] == float(n > 0)
        previous = n
    # staff may see every document but NOONE: without it in the list, staff never leaks
    assert set(acl_metrics([d for d in ranked if d != "NOONE"], CORPUS, ["staff"], KS).values()) <= {0.0}


def test_metrics_are_registered_lower_is_better_and_shown_with_at() -> None:
    for name, base, binary in (
        ("acl_leak_at_10", "acl_leak", False),
        ("acl_leak_rate_at_5", "acl_leak_rate", True),
    ):
        spec, _ = parse_metric_name(name)
        assert (spec.base, spec.binary, spec.takes_k, spec.direction) == (base, binary, True, "lower")
        assert direction_of(f"holdout/{name}") == "lower"
    assert display_name("dev/acl_leak_rate_at_10") == "dev/acl_leak_rate@10"
    assert parse_metric_name("acl_leak@3")[1] == 3
    assert {"acl_leak_at_10", "acl_leak_rate_at_10"} <= set(default_compare_metrics())
    assert {REGISTRY[b].family for b in ("acl_leak", "acl_leak_rate")} == {"security"}


# --------------------------------------------------------------------------- restricted documents

INTERNAL = [
    {
        "doc_id": "INT_RET",
        "title": "Internal returns handbook",
        "allowed_groups": ["staff"],
        "text": "Internal only. Staff may approve a return of an item after 30 days of delivery. "
        "A late return of an item is refunded to the original payment method. Staff may waive the "
        "return shipping fee for a faulty item. Never tell customers how many days staff can extend.",
    },
    {
        "doc_id": "INT_FIN",
        "title": "Finance refunds desk",
        "allowed_groups": ["finance", "staff"],
        "text": "Finance only. Refunds of a returned item go to the original payment method. Finance "
        "approves refunds above 500 dollars. Return shipping for a faulty item is booked as a cost. "
        "Express shipping refunds are booked the next day.",
    },
    {
        "doc_id": "LOCKED",
        "title": "Legal hold",
        "allowed_groups": [],
        "text": "Legal hold: do not share. Warranty claims for water damage and returns of an item under "
        "investigation are frozen. Shipping of held items is suspended.",
    },
]
USERS: dict[str, list[str] | None] = {
    "q1": None,  # anonymous
    "q2": ["customer"],
    "q3": ["staff"],
    "q4": ["finance"],
    "q5": ["customer"],  # unanswerable
    "q6": ["customer"],  # no_rag
    "q7": ["customer", "finance"],
    "q8": ["staff"],
}


def _queries() -> list[dict[str, Any]]:
    out = []
    for q in QUERIES:
        q = dict(q)
        if USERS[q["query_id"]] is not None:
            q["user_groups"] = USERS[q["query_id"]]
        out.append(q)
    return out


@pytest.fixture(scope="module")
def acl_dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    folder = write_dataset(tmp_path_factory.mktemp("acl") / "acl", docs=DOCS + INTERNAL, queries=_queries())
    return load_dataset(folder)


def _settings(**retrieval: Any) -> RunConfig:
    s = RunConfig()
    s.progress = False
    s.chunk.size, s.chunk.overlap = 12, 2  # several chunks per document
    s.retrieval = replace(s.retrieval, **retrieval)
    return s


def _run(settings: RunConfig, ds: Dataset) -> list[dict[str, Any]]:
    system = LocalSystem(settings)
    system.prepare(ds)
    try:
        return evaluate(system, ds, KS)
    finally:
        system.close()


def _visible_everywhere(records: list[dict[str, Any]], ds: Dataset) -> bool:
    users = {q.query_id: q.user_groups for q in ds.queries}
    return all(
        may_see(ds.documents[r["doc_id"]].allowed_groups, users[rec["query_id"]])
        for rec in records
        for r in rec["retrieved"]
    )


def test_score_record_measures_answerable_and_unanswerable_queries_only_when_documents_are_restricted(
    acl_dataset: Dataset,
) -> None:
    by_id = {q.query_id: q for q in acl_dataset.queries}
    retrieved = [
        {"doc_id": d, "start": 0, "end": 5} for d in ("INT_RET", "RET", "INT_FIN", "INT_RET", "LOCKED")
    ]
    rec = {"status": "ok", "retrieved": retrieved, "timings_ms": {"total": 1.0}}
    m = {qid: score_record(rec, by_id[qid], acl_dataset.documents, [1, 5], routed=False) for qid in by_id}
    # q1 anonymous: INT_RET at 1; INT_RET, INT_FIN, LOCKED in the top 5
    assert (m["q1"]["acl_leak_at_1"], m["q1"]["acl_leak_at_5"], m["q1"]["acl_leak_rate_at_1"]) == (
        1.0,
        3.0,
        1.0,
    )
    assert (m["q4"]["acl_leak_at_1"], m["q4"]["acl_leak_at_5"]) == (1.0, 2.0)  # finance sees INT_FIN
    assert (m["q3"]["acl_leak_at_1"], m["q3"]["acl_leak_at_5"]) == (0.0, 1.0)  # staff: LOCKED only
    assert m["q5"]["acl_leak_at_5"] == 3.0  # an unanswerable query is measured too (no recall)
    assert "recall_at_5" not in m["q5"]
    assert not any(k.startswith("acl_") for k in m["q6"])  # no_rag: nothing retrieved for an answer
    # a corpus without allowed_groups cannot leak: the metrics are absent, not 0
    plain = {d: replace(doc, allowed_groups=None) for d, doc in acl_dataset.documents.items()}
    assert not has_restrictions(plain) and has_restrictions(acl_dataset.documents)
    assert not any(k.startswith("acl_") for k in score_record(rec, by_id["q1"], plain, [5], routed=False))


def test_leaks_are_aggregated_per_split_as_means(acl_dataset: Dataset) -> None:
    recs = _run(_settings(top_k=5), acl_dataset)
    agg = aggregate(recs)
    for split in ("dev", "holdout", "all"):
        rows = [
            r for r in recs if (split == "all" or r["split"] == split) and "acl_leak_at_5" in r["metrics"]
        ]
        if not rows:
            continue
        assert agg[f"{split}/acl_leak_at_5"] == pytest.approx(
            np.mean([r["metrics"]["acl_leak_at_5"] for r in rows])
        )
        assert agg[f"{split}/acl_leak_rate_at_5"] == pytest.approx(
            sum(r["metrics"]["acl_leak_at_5"] > 0 for r in rows) / len(rows)
        )
    assert agg["all/acl_leak_rate_at_5"] > 0  # the baseline leaks restricted documents


@pytest.mark.parametrize("method", ["bm25", pytest.param("hybrid", marks=pytest.mark.slow)])  # loads MiniLM
def test_acl_filter_removes_every_leak_and_keeps_k_results(method: str, acl_dataset: Dataset) -> None:
    top_k = 4
    base = _settings(method=method, top_k=top_k)
    if method == "hybrid":  # each retriever's depth equals k: the filter must widen both
        base.retrieval.hybrid = replace(base.retrieval.hybrid, depth_bm25=top_k, depth_dense=top_k)
        base.retrieval.dense = replace(base.retrieval.dense, encoder="minilm")
    leaky = _run(base, acl_dataset)
    filtered = {
        r["query_id"]: r
        for r in _run(replace(base, retrieval=replace(base.retrieval, acl_filter=True)), acl_dataset)
    }
    assert not _visible_everywhere(leaky, acl_dataset)
    assert aggregate(leaky)["all/acl_leak_rate_at_10"] > 0
    assert _visible_everywhere(list(filtered.values()), acl_dataset)
    agg = aggregate(list(filtered.values()))
    assert agg["all/acl_leak_at_10"] == 0.0 and agg["all/acl_leak_rate_at_10"] == 0.0
    system = LocalSystem(base)
    system.prepare(acl_dataset)
    for q in acl_dataset.queries:
        rec = filtered[q.query_id]
        shown = [
            i
            for i, c in enumerate(system.chunks)
            if may_see(acl_dataset.documents[c.doc_id].allowed_groups, q.user_groups)
        ]
        got = [r["chunk_id"] for r in rec["retrieved"]]
        if method == "bm25":
            # reference: rank every chunk, drop what the user may not see, then cut at k
            everything = system.retriever.search(QueryState(q), len(system.chunks))
            allowed = set(shown)
            assert got == [system.chunks[i].chunk_id for i, _ in everything if i in allowed][:top_k], (
                q.query_id
            )
        else:  # dense ranks every chunk: k results whenever the user may see k chunks
            assert len(got) == min(top_k, len(shown)), q.query_id
        if len(shown) < len(system.chunks):
            assert "acl_filter" in rec["timings_ms"]


# --------------------------------------------------------------------------- the comparison


def _records(leaks: list[float]) -> list[dict[str, Any]]:
    return [
        {
            "query_id": f"q{i}",
            "query": f"question {i}",
            "split": "holdout",
            "group": f"g{i // 2}",
            "kind": "unanswerable" if i % 5 == 0 else "answerable",
            "status": "ok",
            "metrics": {"acl_leak_rate_at_10": v, "acl_leak_at_10": 2 * v, "recall_at_5": 1.0},
        }
        for i, v in enumerate(leaks)
    ]


def test_a_leak_increase_is_worse_in_the_comparison_and_a_decrease_better() -> None:
    clean = [0.0] * 40
    leaky = [1.0 if i % 3 else 0.0 for i in range(40)]  # 26 of 40 queries leak
    metrics = ["acl_leak_rate_at_10", "acl_leak_at_10", "recall_at_5"]
    for base, var, verdict in ((clean, leaky, "worse"), (leaky, clean, "better")):
        c = compare(
            [VariantData("baseline", _records(base)), VariantData("v", _records(var))],
            metrics=metrics,
            splits=["holdout"],
            B=2000,
        )
        for m in ("acl_leak_rate_at_10", "acl_leak_at_10"):
            row = c.row("holdout", "v", m)
            assert row is not None and row.direction == "lower" and row.n_queries == 40
            scale = 2.0 if m == "acl_leak_at_10" else 1.0
            assert row.effect == pytest.approx(scale * (np.mean(var) - np.mean(base)))
            assert row.ci_low <= row.effect <= row.ci_high
            assert row.verdict == verdict, m
        recall = c.row("holdout", "v", "recall_at_5")
        assert (
            recall is not None and recall.effect == 0.0 and not recall.significant
        )  # recall does not hide it


def test_runs_without_restricted_documents_get_no_leak_rows_or_column() -> None:
    recs = [{**r, "metrics": {"recall_at_5": float(i % 2)}} for i, r in enumerate(_records([0.0] * 20))]
    c = compare([VariantData("baseline", recs), VariantData("v", recs)], splits=["holdout"], B=200)
    assert not [r for r in c.rows if r.metric.startswith("acl_")]
    headers, _ = summary_rows([{"label": "b", "metrics": aggregate(recs)}], ["recall_at_5"])
    assert not any("acl" in h for h in headers)


# --------------------------------------------------------------------------- system=http and rag-ablate serve


def test_system_http_sends_each_users_groups_and_the_reference_service_filters_by_them(
    acl_dataset: Dataset,
) -> None:
    from rag_ablate.cli.serve import EvalRequest, ReferenceService, create_app
    from rag_ablate.systems.http import WARMUP_ID
    from tests.test_http_system import uvicorn_app

    def through_http(settings: RunConfig) -> tuple[list[dict[str, Any]], list[EvalRequest]]:
        served = LocalSystem(settings)
        served.prepare(acl_dataset)
        service = ReferenceService(served, acl_dataset, settings, "acl")
        seen: list[EvalRequest] = []
        run = service.run

        def recording(req: EvalRequest) -> Any:
            seen.append(req)
            return run(req)

        service.run = recording  # type: ignore[method-assign]
        with uvicorn_app(create_app(service, piece_delay_s=0.0)) as url:
            http = replace(
                settings, system=replace(settings.system, name="http", base_url=url, chat_path=None)
            )
            system = SYSTEMS.get("http")(http, None)
            system.prepare(acl_dataset)
            try:
                return evaluate(system, acl_dataset, KS), seen
            finally:
                system.close()

    base = _settings(top_k=5)
    open_records, seen = through_http(base)
    sent = {r.query_id: r.user_groups for r in seen if r.query_id != WARMUP_ID}  # warm-ups: untimed, ignored
    assert sent == {qid: None if g is None else tuple(g) for qid, g in USERS.items()}  # groups in every body
    filtered, _ = through_http(replace(base, retrieval=replace(base.retrieval, acl_filter=True)))
    assert aggregate(open_records)["all/acl_leak_rate_at_10"] > 0
    assert _visible_everywhere(filtered, acl_dataset) and aggregate(filtered)["all/acl_leak_at_10"] == 0.0
    # the same as the local pipeline with the filter: the service honoured the groups it was sent
    local = _run(replace(base, retrieval=replace(base.retrieval, acl_filter=True)), acl_dataset)
    assert [[c["chunk_id"] for c in r["retrieved"]] for r in filtered] == [
        [c["chunk_id"] for c in r["retrieved"]] for r in local
    ]
    # a staff user still gets internal documents through the filter
    staff = next(r for r in filtered if r["query_id"] == "q8")
    assert any(acl_dataset.documents[c["doc_id"]].allowed_groups for c in staff["retrieved"])


# --------------------------------------------------------------------------- the embedded sample


@pytest.mark.slow
def test_the_sample_leaks_in_the_baseline_and_not_with_the_filter(
    sample_answers_sweep: dict[str, Any],
) -> None:
    """The sample's sweep with retrieval.acl_filter=true beside the baseline, shared by the session
    (tests/conftest.py; its third job, generator=extractive, is test_answers.py's): read only."""
    ds = load_dataset(None)
    assert has_restrictions(ds.documents)
    assert {q.user_groups for q in ds.queries} >= {None, ("customer",), ("staff",)}
    sweep, jobs = sample_answers_sweep["dir"], sample_answers_sweep["jobs"]
    by_label = {label: json.loads((j / "summary.json").read_text())["metrics"] for label, j in jobs.items()}
    base, filt = by_label["baseline"], by_label["retrieval.acl_filter=true"]
    for split in ("dev", "holdout"):
        assert base[f"{split}/acl_leak_rate_at_10"] > 0 and base[f"{split}/acl_leak_at_10"] > 0
        assert filt[f"{split}/acl_leak_rate_at_10"] == 0.0 and filt[f"{split}/acl_leak_at_10"] == 0.0
    # the end-of-run table shows the leak beside recall
    assert "acl_leak_rate@10" in sample_answers_sweep["proc"].stdout
    comparison = json.loads((sweep / "comparison.json").read_text())
    filtered = [r for r in comparison["rows"] if r["variant"] == "retrieval.acl_filter=true"]
    rows = {(r["split"], r["metric"]): r for r in filtered}
    row = rows[("holdout", "acl_leak_rate_at_10")]
    assert row["direction"] == "lower" and row["variant_mean"] == 0.0 and row["baseline_mean"] > 0
    assert row["effect"] < 0 and row["ci_low"] <= row["effect"] <= row["ci_high"]
