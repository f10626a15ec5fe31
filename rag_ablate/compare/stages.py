"""Which stage lost the queries, and how each stage's share moved (docs/metrics.md "Stage diagnosis").

Read from the records only: each record's ``failure_stage`` (written when it was scored, from its
trace and the labels; :mod:`rag_ablate.metrics.stages`) and its ``stage_<stage>`` indicators.

* ``shares``: per variant and split, the queries per stage and the failed queries (not diagnosed);
* ``rows``: the comparison itself (:func:`rag_ablate.compare.analysis.compare`) run over the
  ``stage_<stage>`` metrics: a stage's share is the mean of a per-query 0/1 indicator, so the
  same paired group test, interval and seeds apply, over the queries diagnosed on both sides.
  Their p values are adjusted among these rows only (Holm on holdout, BH on dev), apart from the
  main rows: the stages are a diagnosis, not the release decision. A stage no query of the
  baseline or a variant reached has no row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rag_ablate.compare.analysis import compare
from rag_ablate.compare.model import Comparison, StageSection, StageShare, VariantData
from rag_ablate.metrics.registry import stage_metrics
from rag_ablate.metrics.stages import STAGES, stage_metric


def stage_section(variants: Sequence[VariantData], c: Comparison) -> StageSection | None:
    """The failure stages of ``c``'s baseline and variants; None when no record was diagnosed
    (records written before stages were, or only failed and no_rag queries)."""
    labels = [c.baseline, *c.variants]
    chosen = [v for label in labels for v in variants if v.label == label]
    if not any(r.get("failure_stage") is not None for v in chosen for r in v.records):
        return None
    section = StageSection(list(STAGES), [])
    for v in chosen:
        for split in c.splits:
            rows = [r for r in v.records if r["split"] == split]
            if not rows:
                continue
            found = Counter(str(r.get("failure_stage")) for r in rows if r.get("failure_stage") is not None)
            section.shares.append(
                StageShare(
                    v.label,
                    split,
                    n_diagnosed=sum(found.values()),
                    n_failed=sum(1 for r in rows if r["status"] != "ok"),
                    counts={stage: found[stage] for stage in STAGES},
                )
            )
    undiagnosed = [v.label for v in chosen if not any(r.get("failure_stage") is not None for r in v.records)]
    if undiagnosed:
        section.notes.append(
            f"no diagnosed record in {', '.join(undiagnosed)} (records written before failure stages were): "
            "its stage rows have no numbers"
        )
    reached = {stage for x in section.shares for stage, n in x.counts.items() if n}
    section.metrics = [m for m in stage_metrics() if any(m == stage_metric(s) for s in reached)]
    if not section.metrics:  # diagnosed only outside the compared splits
        return section
    moved = compare(
        chosen,
        baseline=c.baseline,
        metrics=section.metrics,
        splits=c.splits,
        B=c.B,
        seed=c.seed,
        alpha=c.alpha,
    )
    section.rows = moved.rows
    return section
