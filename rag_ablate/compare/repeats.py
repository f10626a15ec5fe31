"""Repeated runs in the comparison (``system.repeats`` > 1): one value per query, and flaky queries.

A variant run with repeats has one record per (query, repeat). The comparison stands one record
for each query (:func:`~rag_ablate.records.repeats.mean_record`): every metric is the mean over
the query's repeats of its failure-aware value, and ``error_rate`` the share of repeats that
failed. The paired test, its interval and the group bootstrap then resample near-duplicate groups,
each carrying its queries and their repeat means: the nested resampling whose variance counts the
within-query noise once (``var = var_between / n + var_within / (n k)``). Resampling the repeats
again inside each drawn query would count it twice (docs/statistics.md "Repeated runs";
benchmarks/bench_repeats.py measures both).

Flaky queries, whose repeats gave both verdicts of a binary metric, are listed per variant
(:class:`~rag_ablate.compare.model.RepeatSummary`) with their text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rag_ablate.compare.analysis import value
from rag_ablate.compare.model import FlakyQuery, RepeatSummary, VariantData
from rag_ablate.records.repeats import has_repeats, mean_record, query_spreads, runs_by_query

FLAKY_SHOWN = 50  # flaky queries kept per variant (all are counted)


def summary(v: VariantData) -> RepeatSummary:
    """A repeated variant's runs per query and its flaky queries."""
    spreads = query_spreads(v.records)
    flaky = [
        FlakyQuery(s.split, s.query_id, s.query, {m: s.verdicts[m] for m in s.verdicts if s.flaky(m)})
        for s in spreads
        if any(s.flaky(m) for m in s.verdicts)
    ]
    flaky.sort(key=lambda f: (f.split, f.query_id))
    return RepeatSummary(v.label, max(s.n for s in spreads), len(spreads), len(flaky), flaky[:FLAKY_SHOWN])


def repeat_means(variants: Sequence[VariantData]) -> tuple[list[VariantData], list[RepeatSummary]]:
    """Every variant with one record per query (a repeated one's :func:`mean_record` per query, in
    the order of its first runs), and the summary of each repeated variant. Variants without
    repeats are returned as they are."""
    out: list[VariantData] = []
    summaries: list[RepeatSummary] = []
    for v in variants:
        if not has_repeats(v.records):
            out.append(v)
            continue
        summaries.append(summary(v))
        means = [mean_record(runs, value) for runs in runs_by_query(v.records).values()]
        out.append(replace(v, records=means))
    return out, summaries
