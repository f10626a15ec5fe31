"""Prediction-powered inference for judged metrics (docs/statistics.md "Judge bias and human labels").

An LLM judge is biased: an interval around its mean is confidently wrong when the judge scores
answers higher (or lower) than people do. When the dataset's ``human_judgements`` score some of
the answers a run produced, the comparison corrects the judge with them (Angelopoulos et al.
2023, "Prediction-powered inference"):

    theta_PP = mean of the judge over all N queries + mean of (human - judge) over the n labelled

per side, and for the paired effect the difference of the two sides' estimates. The second term
is the judge's bias measured where both scores exist; it is unbiased when the labelled answers
are a random subset of the answered queries, whatever the judge's error.

Which queries: per split, variant and judged metric in ``compare.metrics``, the queries both sides
have a judged value for (:func:`rag_ablate.compare.analysis.value`: a failed query scores the
metric's miss, 0). A human score belongs to a record when the person scored that very answer
(``human_judgements[].answer`` equal to the record's answer, whitespace collapsed; several raters
are averaged). A failed query has no answer, so no label; the people's score of it is the miss too,
so the correction is weighted by the share of answered queries:
``theta_PP = (sum J + n_ok * sum_L (H - J) / n_L) / N``.

Intervals: percentile group bootstrap (one draw per split and group set, as the comparison's),
the same draws for the plain and the corrected estimates and for both sides, so the effect's
interval keeps the pairing. A side with fewer than :data:`MIN_LABELS` labelled answers gets a row
with a note and no estimates. Nothing here reads MLflow or writes files.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rag_ablate.compare import stats
from rag_ablate.compare.analysis import failed, value
from rag_ablate.compare.draws import Collector, SharedDraws, products
from rag_ablate.compare.model import Comparison, PPIRow, PPISection, VariantData
from rag_ablate.core.errors import RagAblateError
from rag_ablate.dataset.model import HumanJudgement
from rag_ablate.metrics.registry import display_name, spec_of
from rag_ablate.records.trace import Record

FloatArray = npt.NDArray[np.float64]

#: labelled answers each side needs before its prediction-powered estimate is reported
MIN_LABELS = 10

#: the per-query columns, summed per group: size, then per side judge, answered, human - judge, labelled
COLUMNS = ("m", "j_b", "ok_b", "r_b", "l_b", "j_v", "ok_v", "r_v", "l_v")
#: what :func:`estimates` returns along its last axis
ESTIMATES = ("baseline_plain", "baseline_ppi", "variant_plain", "variant_ppi", "effect_plain", "effect_ppi")

Labels = Mapping[str, Sequence[HumanJudgement]]


# --------------------------------------------------------------------------- the estimator


def side_columns(j: npt.ArrayLike, ok: npt.ArrayLike, h: npt.ArrayLike) -> FloatArray:
    """One side's per-query columns (judge, answered, human - judge, labelled) along a new last
    axis; ``h`` is NaN where no person scored the answer. Any leading shape (queries first)."""
    jj = np.asarray(j, dtype=np.float64)
    hh = np.asarray(h, dtype=np.float64)
    labelled = np.isfinite(hh)
    r = np.where(labelled, hh - jj, 0.0)
    return np.stack([jj, np.asarray(ok, dtype=np.float64), r, labelled.astype(np.float64)], axis=-1)


def query_columns(base: FloatArray, var: FloatArray) -> FloatArray:
    """The :data:`COLUMNS` of each query from the two sides' :func:`side_columns`."""
    return np.concatenate([np.ones((*base.shape[:-1], 1)), base, var], axis=-1)


def group_totals(columns: FloatArray, codes: npt.NDArray[np.int64], n_groups: int) -> FloatArray:
    """Per-group sums of per-query ``columns`` (queries on the first axis; group codes 0..G-1)."""
    order = np.argsort(codes, kind="stable")
    ordered = codes[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    out = np.zeros((n_groups, *columns.shape[1:]))
    out[ordered[starts]] = np.add.reduceat(columns[order], starts, axis=0)
    return out


def estimates(totals: FloatArray) -> FloatArray:
    """The :data:`ESTIMATES` from column totals (last axis :data:`COLUMNS`; any leading shape: the
    whole sample's totals, or one bootstrap draw's per row). NaN where a side has no label."""
    m, jb, okb, rb, lb, jv, okv, rv, lv = np.moveaxis(totals, -1, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        pb, pv = jb / m, jv / m
        qb = (jb + okb * rb / lb) / m
        qv = (jv + okv * rv / lv) / m
    return np.stack([pb, qb, pv, qv, pv - pb, qv - qb], axis=-1)


def intervals(draws: FloatArray, alpha: float) -> tuple[FloatArray, FloatArray]:
    """Percentile bounds over the bootstrap axis (the first) of :func:`estimates` of the draws;
    a draw without a labelled group on a side (NaN) is left out."""
    q = [100 * alpha / 2, 100 * (1 - alpha / 2)]
    # np.percentile's one sort along the axis is many times faster than nanpercentile's per column
    lo, hi = np.nanpercentile(draws, q, axis=0) if np.isnan(draws).any() else np.percentile(draws, q, axis=0)
    return np.asarray(lo), np.asarray(hi)


# --------------------------------------------------------------------------- the labels


def _norm(answer: str) -> str:
    return " ".join(answer.split())


def human_scores(labels: Labels) -> dict[tuple[str, str], dict[str, float]]:
    """(query id, answer with whitespace collapsed) -> metric -> the raters' mean score."""
    scores: dict[tuple[str, str], dict[str, list[int]]] = {}
    for qid, judgements in labels.items():
        for h in judgements:
            by_metric = scores.setdefault((qid, _norm(h.answer)), {})
            for metric, score in h.scores.items():
                by_metric.setdefault(metric, []).append(score)
    return {k: {m: sum(v) / len(v) for m, v in d.items()} for k, d in scores.items()}


def _human(rec: Record, metric: str, scores: Mapping[tuple[str, str], Mapping[str, float]]) -> float:
    answer = rec.get("answer")
    if failed(rec) or not isinstance(answer, str):
        return math.nan
    return scores.get((rec["query_id"], _norm(answer)), {}).get(metric, math.nan)


def read_labels(variant: VariantData) -> tuple[Labels, str]:
    """The ``human_judgements`` of the dataset a variant's ``config.yaml`` names (the embedded sample
    when it names none), and the folder they came from."""
    from rag_ablate.dataset.load import read_human_judgements
    from rag_ablate.dataset.model import sample_dataset_path
    from rag_ablate.metrics.registry import human_metrics

    dataset = (variant.config or {}).get("dataset") or {}
    path = dataset.get("path") if isinstance(dataset, Mapping) else None
    folder = Path(str(path)).expanduser() if path else sample_dataset_path()
    return read_human_judgements(folder, human_metrics=human_metrics()), str(folder)


# --------------------------------------------------------------------------- the section


@dataclass
class _Planned:
    """One row's inputs, waiting for its split's bootstrap draw."""

    row: PPIRow
    totals: FloatArray
    draws: Collector | None


def _plan(
    split: str,
    variant: str,
    metric: str,
    base: Mapping[str, Record],
    var: Mapping[str, Record],
    scores: Mapping[tuple[str, str], Mapping[str, float]],
    shared: SharedDraws,
    seed: int,
) -> _Planned | None:
    ids: list[str] = []
    cols: list[list[float]] = [[] for _ in range(6)]  # j_b, ok_b, h_b, j_v, ok_v, h_v
    for qid, b in base.items():
        v = var.get(qid)
        if v is None:
            continue
        jb, jv = value(b, metric), value(v, metric)
        if jb is None or jv is None:
            continue
        ids.append(qid)
        for k, x in enumerate((jb, not failed(b), _human(b, metric, scores), jv, not failed(v))):
            cols[k].append(float(x))
        cols[5].append(_human(v, metric, scores))
    if not ids:
        return None
    a = np.asarray(cols, dtype=np.float64)
    per_query = query_columns(side_columns(a[0], a[1], a[2]), side_columns(a[3], a[4], a[5]))
    groups = [str(base[q]["group"]) for q in ids]
    uniq, codes = np.unique(np.asarray(groups), return_inverse=True)
    totals = group_totals(per_query, np.asarray(codes, dtype=np.int64).reshape(-1), len(uniq))
    lb, lv = int(totals[:, 4].sum()), int(totals[:, 8].sum())
    both = int(np.sum(np.isfinite(a[2]) & np.isfinite(a[5])))
    row = PPIRow(split, variant, metric, len(ids), len(uniq), lb, lv, both)
    if min(lb, lv) < MIN_LABELS:
        row.note = f"too few human labels (baseline {lb}, variant {lv}; each side needs {MIN_LABELS})"
        return _Planned(row, totals.sum(axis=0), None)
    digest = hashlib.sha256("\x1f".join(uniq.tolist()).encode("utf-8")).hexdigest()[:16]
    draw_seed = stats.derive_seed(seed, "ppi", split, digest)
    return _Planned(
        row, totals.sum(axis=0), shared.add((split, digest), draw_seed, len(uniq), products(totals))
    )


def _fill(p: _Planned, alpha: float) -> PPIRow:
    row, t = p.row, p.totals
    point = estimates(t)
    with np.errstate(divide="ignore", invalid="ignore"):
        row.judge_bias_baseline = float(-t[3] / t[4]) if t[4] else math.nan
        row.judge_bias_variant = float(-t[7] / t[8]) if t[8] else math.nan
    if p.draws is None:  # too few labels: the plain means only
        row.baseline_plain, row.variant_plain, row.effect_plain = (float(point[i]) for i in (0, 2, 4))
        return row
    lo, hi = intervals(estimates(p.draws.result()), alpha)
    for i, name in enumerate(ESTIMATES):
        side, kind = name.split("_")
        setattr(row, name, float(point[i]))
        setattr(row, f"{side}_{kind}_low", float(lo[i]))
        setattr(row, f"{side}_{kind}_high", float(hi[i]))
    return row


#: a side with fewer labels than this share of the other side's is flagged (:func:`uneven_note`)
UNEVEN = 0.8


def uneven(r: PPIRow) -> bool:
    lb, lv = r.n_labelled_baseline, r.n_labelled_variant
    return min(lb, lv) < UNEVEN * max(lb, lv)


def uneven_note(r: PPIRow) -> str:
    """Why a row whose sides have unlike numbers of labels needs care."""
    fewer = "variant" if r.n_labelled_variant < r.n_labelled_baseline else "baseline"
    return (
        f"{r.split}, {r.variant}, {display_name(r.metric)}: people scored {r.n_labelled_baseline} of the "
        f"baseline's answers and {r.n_labelled_variant} of the variant's; where the {fewer}'s answers differ "
        "from the scored ones they have no label, so its labelled queries may not be a random sample and "
        "its correction may be biased: have its answers to the same queries scored (docs/statistics.md)"
    )


def compute(
    variants: Sequence[VariantData], c: Comparison, labels: Labels, source: str, metrics: Sequence[str]
) -> PPISection:
    """The section for ``c``'s splits and variants and the judged ``metrics``, given the labels."""
    by_label = {v.label: v for v in variants}
    scores = human_scores(labels)
    section = PPISection(source, MIN_LABELS, c.B, c.seed, c.alpha)
    shared = SharedDraws(c.B)
    planned: list[_Planned] = []
    for split in c.splits:
        base = {r["query_id"]: r for r in by_label[c.baseline].records if r["split"] == split}
        for label in c.variants:
            var = {r["query_id"]: r for r in by_label[label].records if r["split"] == split}
            for metric in metrics:
                p = _plan(split, label, metric, base, var, scores, shared, c.seed)
                if p is not None:
                    planned.append(p)
    shared.run()
    # a metric no person scored on either side of a split has no row
    section.rows = [
        _fill(p, c.alpha) for p in planned if p.row.n_labelled_baseline or p.row.n_labelled_variant
    ]
    section.notes += [uneven_note(r) for r in section.rows if not r.note and uneven(r)]
    if not section.rows:
        section.notes.append(
            f"the dataset's human_judgements ({sum(len(v) for v in labels.values())}) score none of these "
            "runs' answers: prediction-powered estimates need people's scores of the answers the runs "
            "gave (the judge calibration, judge_calibration.md, uses them as they are)"
        )
    return section


def ppi_section(
    variants: Sequence[VariantData],
    c: Comparison,
    *,
    labels_factory: Callable[[VariantData], tuple[Labels, str]] = read_labels,
) -> PPISection | None:
    """The prediction-powered section of ``c``, or None when no judged metric has a value or the
    baseline's dataset has no ``human_judgements``; labels that cannot be read become a note of
    ``c``, never a failed comparison."""
    metrics = [m for m in c.metrics if spec_of(m).judged and spec_of(m).human]
    base = next((v for v in variants if v.label == c.baseline), None)
    if base is None or not any(r.tested and r.metric in metrics for r in c.rows):
        return None
    try:
        labels, source = labels_factory(base)
    except RagAblateError as exc:
        c.notes.append(f"prediction-powered estimates not computed: {exc}")
        return None
    if not labels:
        return None
    return compute(variants, c, labels, source, metrics)


# --------------------------------------------------------------------------- rendering


def _num(v: float, signed: bool = False) -> str:
    if not math.isfinite(v):
        return "-"
    return f"{v:+.3f}" if signed else f"{v:.3f}"


def estimate_text(v: float, lo: float, hi: float, signed: bool = False) -> str:
    """``2.600 [2.430, 2.770]``; the value alone without an interval; ``-`` without a value."""
    if not math.isfinite(v):
        return "-"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return _num(v, signed)
    return f"{_num(v, signed)} [{_num(lo, signed)}, {_num(hi, signed)}]"


def cells(r: PPIRow) -> dict[str, str]:
    """A row's numbers as text, by column (every view's table reads these)."""
    return {
        "labels": f"{r.n_labelled_baseline} / {r.n_labelled_variant} of {r.n_queries}",
        "bias": f"{_num(r.judge_bias_baseline, True)} / {_num(r.judge_bias_variant, True)}",
        "effect_plain": estimate_text(r.effect_plain, r.effect_plain_low, r.effect_plain_high, True),
        "effect_ppi": estimate_text(r.effect_ppi, r.effect_ppi_low, r.effect_ppi_high, True)
        if not r.note
        else r.note,
        "baseline": f"{_num(r.baseline_plain)} -> "
        + estimate_text(r.baseline_ppi, r.baseline_ppi_low, r.baseline_ppi_high),
        "variant": f"{_num(r.variant_plain)} -> "
        + estimate_text(r.variant_ppi, r.variant_ppi_low, r.variant_ppi_high),
    }


HEADERS = {
    "labels": "human labels (baseline / variant)",
    "bias": "judge minus human (baseline / variant)",
    "effect_plain": "effect, judge only [95% CI]",
    "effect_ppi": "effect, prediction-powered [95% CI]",
    "baseline": "baseline: judge -> corrected",
    "variant": "variant: judge -> corrected",
}

EXPLAIN = (
    "Judged metrics corrected by people's scores of the same answers (the dataset's human_judgements): "
    "prediction-powered estimate = the judge's mean over all queries + the mean (human - judge) over the "
    "labelled answers; 95% percentile group-bootstrap intervals. It assumes the labelled answers are a "
    "random subset of the queries (docs/statistics.md)."
)


def terminal_lines(section: PPISection | None) -> list[str]:
    if section is None:
        return []
    out = [f"judge corrected by human labels ({section.labels}):", *(f"  {n}" for n in section.notes)]
    for r in section.rows:
        c = cells(r)
        out.append(
            f"  {r.split}, {r.variant}, {display_name(r.metric)}: labels {c['labels']}, "
            f"judge bias {c['bias']}; "
            f"effect {c['effect_plain']} judge only, {c['effect_ppi']} prediction-powered"
        )
    return out


def markdown_lines(section: PPISection | None) -> list[str]:
    if section is None:
        return []
    out = ["## Judged metrics corrected by human labels", "", EXPLAIN, ""]
    if section.notes:
        out += [*(f"- {n}" for n in section.notes), ""]
    if section.rows:
        keys = list(HEADERS)
        out += [
            "| split | variant | metric | " + " | ".join(HEADERS[k] for k in keys) + " |",
            "|---|---|---|" + "---|" * len(keys),
        ]
        for r in section.rows:
            c = cells(r)
            label = r.variant.replace("|", "\\|")
            out.append(
                f"| {r.split} | {label} | {display_name(r.metric)} | " + " | ".join(c[k] for k in keys) + " |"
            )
        out.append("")
    return out


def delta_metrics(section: PPISection, variant: str) -> dict[str, float]:
    """A child run's corrected effects as MLflow metrics: ``ppi/<split>/<metric>/effect`` and its
    bounds (rows with estimates only)."""
    out: dict[str, float] = {}
    for r in section.rows:
        if r.variant != variant or r.note:
            continue
        key = f"ppi/{r.split}/{r.metric}"
        for name, v in (
            ("effect", r.effect_ppi),
            ("effect_low", r.effect_ppi_low),
            ("effect_high", r.effect_ppi_high),
        ):
            if math.isfinite(v):
                out[f"{key}/{name}"] = v
        out[f"{key}/n_labelled"] = float(r.n_labelled_variant)
    return out
