"""report.html's first screen, rendered from a Comparison built in memory: the verdict per split
(better / worse / no evidence) on the sweep's one quality axis, at its cost, with the other
significant effects; values with HTML in them shown as text; the plots' colours and labels."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from rag_ablate.compare import headline
from rag_ablate.compare.model import Comparison, Flip, Point, Row, SplitTradeoff, Tradeoff, VariantData
from rag_ablate.report import html as html_report
from rag_ablate.report import plots

HOSTILE = "<b>x</b>"


def _row(split: str, variant: str, metric: str, effect: float, verdict: str = "", **kw: Any) -> Row:
    direction = "lower" if metric.startswith(("acl_leak", "latency")) else "higher"
    label = f"{verdict} (after Holm)" if verdict else "no evidence; could detect ±0.045"
    return Row(
        split=split, variant=variant, metric=metric, direction=direction, baseline_mean=0.8,
        variant_mean=0.8 + effect, effect=effect, ci_low=effect - 0.03, ci_high=effect + 0.03, se=0.015,
        p_value=0.01 if verdict else 0.4, p_exact=False, p_bootstrap=0.4, bootstrap_unreliable=False,
        n_queries=110, n_groups=93, p_adjusted=0.02 if verdict else 0.9, adjustment="holm",
        significant=bool(verdict), verdict=verdict, mde=0.045, label=label, **kw,
    )  # fmt: skip


def _comparison() -> Comparison:
    variants = ["up", "down", "flat", HOSTILE]
    rows = []
    for split in ("dev", "holdout"):
        rows += [
            _row(split, "up", "recall_at_5", 0.06, "better"),
            _row(split, "down", "recall_at_5", -0.07, "worse"),
            _row(split, "down", "evidence_recall_at_5", -0.15, "worse"),
            _row(split, "down", "acl_leak_rate_at_10", -0.05, "better"),
            _row(split, "flat", "recall_at_5", 0.01),
            _row(split, HOSTILE, "recall_at_5", -0.01),
        ]
    for r in rows:  # an interval excluding 0 that Holm does not confirm: no evidence, and its MDE
        if r.variant == "flat":
            r.ci_low, r.ci_high, r.label = 0.002, 0.04, "better unadjusted, n.s. after Holm"
    points = [
        Point("baseline", 0.8, 0.75, 0.85, 100, 2.0, 1.8, 2.2, 110, baseline=True, frontier=True),
        *(
            Point(
                v,
                0.8,
                0.75,
                0.85,
                100,
                2.5,
                2.2,
                2.8,
                110,
                cost_effect=0.5,
                cost_effect_low=0.25,
                cost_effect_high=0.75,
            )
            for v in variants
        ),
    ]
    t = Tradeoff(
        quality_metric="recall_at_5", cost_metric="usd_per_1k", quality_higher=True, cost_unit="USD",
        baseline="baseline", quality_bar=None, B=1000, seed=0, alpha=0.05,
        splits=[SplitTradeoff("dev", 200, points), SplitTradeoff("holdout", 93, points)],
    )  # fmt: skip
    flip = Flip(query_id="q1", query=HOSTILE, baseline=1.0, variant=0.0)
    return Comparison(
        baseline="baseline", variants=variants, metrics=["recall_at_5", "evidence_recall_at_5"],
        splits=["dev", "holdout"], B=1000, seed=0, alpha=0.05, rows=rows,
        flips={"down": {"recall_at_5": {"dev": {"regressed": [flip], "improved": []}}}},
        tradeoff=t, quality_metric="recall_at_5", cost_metric="usd_per_1k",
    )  # fmt: skip


def _page(c: Comparison) -> str:
    vs = [VariantData("baseline", []), *(VariantData(v, []) for v in c.variants)]
    return html_report.render(
        title="t", variants=vs, comparison=c, plan=None, tradeoff_png=None, recall_png=None
    )


def test_verdicts_per_split_on_the_quality_axis_with_cost_and_other_effects() -> None:
    c = _comparison()
    found = {(v.split, v.variant): v for v in headline.verdicts(c)}
    assert len(found) == 8
    for split in ("dev", "holdout"):
        assert found[split, "up"].verdict == "better"
        assert found[split, "down"].verdict == "worse"
        assert found[split, "flat"].verdict == "no evidence"
        down = found[split, "down"]
        assert [(o.metric, o.verdict) for o in down.others] == [
            ("evidence_recall_at_5", "worse"),
            ("acl_leak_rate_at_10", "better"),
        ]
        cost = found[split, "flat"].cost
        assert cost is not None and cost.source == "tradeoff"
        assert (cost.effect, cost.ci_low, cost.ci_high) == (0.5, 0.25, 0.75)
    # the quality metric not compared: not tested, never "no evidence"
    c.quality_metric = "ndcg_at_10"
    assert {v.verdict for v in headline.verdicts(c)} == {"not tested"}


def test_the_page_opens_on_the_verdict_in_words_with_intervals() -> None:
    page = _page(_comparison())
    verdict = page.split('<div id="verdict">')[1].split("</div>")[0]
    assert page.index('<div id="verdict">') < page.index("<nav>") < page.index('<section id="plan">')
    assert "Verdict: recall@5 against baseline, at USD per 1k queries" in verdict
    for split in ("dev", "holdout"):
        rows = re.findall(
            rf'<tr class="[a-z]*" data-split="{split}" data-variant="([^"]+)">(.*?)</tr>', verdict, re.S
        )
        cells = dict(rows)
        assert set(cells) == {"up", "down", "flat", "&lt;b&gt;x&lt;/b&gt;"}
        assert '<span class="badge b-better">better</span>' in cells["up"]
        assert "+0.060 [+0.030, +0.090]" in cells["up"]  # the effect and its interval
        assert '<span class="badge b-worse">worse</span>' in cells["down"]
        assert "evidence_recall@5 -0.150" in cells["down"] and "acl_leak_rate@10 -0.050" in cells["down"]
        assert '<span class="badge b-none">no evidence</span>' in cells["flat"]
        assert "better unadjusted, n.s. after Holm; could detect ±0.045" in cells["flat"]
        assert "+0.500 [+0.250, +0.750]" in cells["flat"]  # the cost against the baseline's
        assert "0.900" in cells["flat"]  # adjusted p


def test_values_with_html_in_them_are_text() -> None:
    page = _page(_comparison())
    assert HOSTILE not in page  # the variant label and the flipped query's text
    assert page.count("&lt;b&gt;x&lt;/b&gt;") >= 4
    assert html_report.environment().autoescape is True


def test_an_old_comparison_without_its_axes_takes_the_trade_offs() -> None:
    c = _comparison()
    c.quality_metric = c.cost_metric = ""
    assert (headline.quality_axis(c), headline.cost_axis(c)) == ("recall_at_5", "usd_per_1k")
    c.tradeoff = None
    assert (headline.quality_axis(c), headline.cost_axis(c)) == ("recall_at_5", "")
    assert "no evidence" in _page(c)


def test_every_variant_has_its_own_colour_and_labels_do_not_overlap() -> None:
    labels = ["baseline", *(f"chunk={k}" for k in (64, 128, 256, 1024, 2048, 4096, 8192, 9999, 10000))]
    styles = plots.variant_styles(labels, "baseline")
    assert styles["baseline"] == ("#000000", "*")
    assert len({styles[v][0] for v in labels[:8]}) == 8  # the palette's 8 colours, one each
    assert len(set(styles.values())) == len(labels)  # past the palette: colour and marker still differ
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 1)
    near = [(f"variant number {i}", 5.0 + 0.01 * i, 0.5 + 0.002 * i, i == 0) for i in range(6)]
    anns = plots.place_labels(fig, ax, near)
    renderer = fig.canvas.get_renderer()
    boxes = [plots.label_extent(a, renderer) for a in anns]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (a, b)
    plt.close(fig)
    assert math.isfinite(boxes[0].x0)


@pytest.mark.parametrize("name", ["report.html.j2", "verdict.html.j2", "sections/flips.html.j2"])
def test_templates_escape_everything_they_print(name: str) -> None:
    source = html_report.environment().loader.get_source(html_report.environment(), name)[0]  # type: ignore[union-attr]
    assert "|safe" not in source.replace(" ", "") and "Markup" not in source
