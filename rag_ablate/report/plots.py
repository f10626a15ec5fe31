"""Every plot of the package (matplotlib is imported only when a plot is drawn)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rag_ablate.compare.model import Tradeoff
from rag_ablate.compare.tradeoff import cost_display, fmt
from rag_ablate.core.errors import ConfigError
from rag_ablate.core.fsio import make_dirs, replacing
from rag_ablate.metrics.registry import display_name

#: fonts tried in order; the first installed CJK font lets Chinese labels render
CJK_FONTS = (
    "WenQuanYi Zen Hei",
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Source Han Sans SC",
    "Microsoft YaHei",
    "SimHei",
    "PingFang SC",
    "Hiragino Sans GB",
    "Arial Unicode MS",
)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend with a CJK-capable font list (imported here only)."""
    import logging

    import matplotlib

    # CJK fonts such as WenQuanYi Zen Hei come in one weight (500): matplotlib uses it for normal and
    # bold text, which is what we want, but warns on every lookup, into the sweep's log and terminal
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import font_manager

    installed = {f.name for f in font_manager.fontManager.ttflist}
    fonts = [f for f in CJK_FONTS if f in installed]
    plt.rcParams["font.family"] = "sans-serif"
    plt.rcParams["font.sans-serif"] = [*fonts, "DejaVu Sans"]
    plt.rcParams["axes.unicode_minus"] = False
    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Save and close; without a CJK font, missing glyphs draw as boxes instead of failing."""
    import warnings

    plt = pyplot()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph .* missing from", category=UserWarning)
        with replacing(path) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight", format=path.suffix.lstrip(".") or "png")
    plt.close(fig)


def plot(
    t: Tradeoff, path: Path, *, split: str | None = None, labels: Mapping[str, str] | None = None
) -> Path:
    """Draw ``quality_vs_cost.png``: cost on x, quality on y, intervals on both, frontier, bar."""
    plt = pyplot()
    st = t.split(split or t.plot_split)
    if st is None:
        raise ConfigError(f"the trade-off has no split '{split}'")
    names = dict(labels or {})
    q, c = display_name(t.quality_metric), cost_display(t.cost_metric)
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    pts = [p for p in st.points if math.isfinite(p.quality) and math.isfinite(p.cost)]
    front = sorted((p for p in pts if p.frontier), key=lambda p: (p.cost, p.quality))
    if len(front) > 1:
        ax.plot(
            [p.cost for p in front],
            [p.quality for p in front],
            "--",
            color="#2a9d8f",
            lw=1.5,
            zorder=1,
            label="Pareto frontier",
        )
    for p in pts:
        xerr = (
            [[max(p.cost - p.cost_low, 0.0)], [max(p.cost_high - p.cost, 0.0)]]
            if math.isfinite(p.cost_low)
            else None
        )
        yerr = (
            [[max(p.quality - p.quality_low, 0.0)], [max(p.quality_high - p.quality, 0.0)]]
            if math.isfinite(p.quality_low)
            else None
        )
        if p.baseline:
            style = {"fmt": "*", "color": "#d62828", "ms": 16, "mec": "black", "label": "baseline"}
        elif p.frontier:
            style = {"fmt": "o", "color": "#2a9d8f", "ms": 9, "mec": "black"}
        else:
            style = {"fmt": "o", "color": "#8d99ae", "ms": 8, "mec": "black"}
        ax.errorbar(p.cost, p.quality, xerr=xerr, yerr=yerr, capsize=3, elinewidth=1, zorder=3, **style)
        text = names.get(p.variant, p.variant)
        if p.variant == st.choice:
            text += "  (cheapest above bar)"
        ax.annotate(
            text,
            (p.cost, p.quality),
            textcoords="offset points",
            xytext=(7, 7),
            fontsize=9,
            weight="bold" if p.baseline else "normal",
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.6},
            zorder=4,
        )
    if t.quality_bar is not None:
        ax.axhline(
            t.quality_bar,
            color="#e76f51",
            ls=":",
            lw=1.5,
            label=f"quality bar {q} {'>=' if t.quality_higher else '<='} {fmt(t.quality_bar)}",
        )
    level = round(100 * (1 - t.alpha))
    unit = f" ({t.cost_unit})" if t.cost_unit and t.cost_unit not in c else ""
    ax.set_xlabel(f"{c}{unit}  - lower is cheaper")
    ax.set_ylabel(f"{st.split} {q}  - {'higher' if t.quality_higher else 'lower'} is better")
    ax.set_title(f"{st.split}: {q} against {c}  ({level}% group-bootstrap intervals)", fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.margins(x=0.2, y=0.15)
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="best", fontsize=8)
    make_dirs(path.parent)
    save_figure(fig, path)
    return path
