"""Every plot of the package (matplotlib is imported only when a plot is drawn)."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
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


@contextlib.contextmanager
def missing_glyphs_drawn() -> Iterator[None]:
    """Without a CJK font, missing glyphs draw as boxes instead of failing (no warning)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph .* missing from", category=UserWarning)
        yield


def save_figure(fig: Any, path: Path) -> None:
    """Save and close; without a CJK font, missing glyphs draw as boxes instead of failing."""
    plt = pyplot()
    with missing_glyphs_drawn(), replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format=path.suffix.lstrip(".") or "png")
    plt.close(fig)


#: Okabe and Ito's colour-blind safe palette, the baseline's black first; yellow last (faint on white)
PALETTE = ("#000000", "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442")
#: markers cycled with the colours, so variants beyond the palette still differ
MARKERS = ("*", "o", "s", "^", "D", "v", "P", "X")


def variant_styles(labels: Sequence[str], baseline: str) -> dict[str, tuple[str, str]]:
    """label -> (colour, marker): the baseline black with a star, every other variant its own colour
    of :data:`PALETTE` (and marker) in the order given; past the palette, colour and marker pairs
    repeat shifted so no two variants share both."""
    others = [v for v in labels if v != baseline]
    out = {baseline: (PALETTE[0], MARKERS[0])}
    n = len(PALETTE) - 1
    for i, v in enumerate(others):
        out[v] = (PALETTE[1 + i % n], MARKERS[1 + (i + i // n) % (len(MARKERS) - 1)])
    return out


#: label offsets tried around a point, in points: beside it first, then stacked further up and down
_OFFSETS = (
    (7, 7), (7, -14), (-7, 7), (-7, -14), (10, -3), (-10, -3),
    *((dx, dy * k) for k in range(2, 12) for dx in (7, -7) for dy in (11, -13)),
)  # fmt: skip


def label_extent(ann: Any, renderer: Any) -> Any:
    """Where a label's text is drawn, in pixels (its line to the point left out)."""
    from matplotlib.text import Text

    return Text.get_window_extent(ann, renderer)


def place_labels(fig: Any, ax: Any, labels: Sequence[tuple[str, float, float, bool]]) -> list[Any]:
    """Annotate each (text, x, y, bold) point where its label overlaps no earlier label and no point's
    marker: the first free offset of :data:`_OFFSETS` (the last one tried when none is free)."""
    with missing_glyphs_drawn():
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    to_px = ax.transData.transform
    marks = [to_px((x, y)) for _, x, y, _ in labels]
    r = 9.0 * fig.dpi / 72  # a marker's half-size and a margin, in pixels
    taken = [(mx - r, my - r, mx + r, my + r) for mx, my in marks]
    out = []
    for text, x, y, bold in labels:
        for dx, dy in _OFFSETS:
            ann = ax.annotate(
                text,
                (x, y),
                textcoords="offset points",
                xytext=(dx, dy),
                ha="left" if dx >= 0 else "right",
                fontsize=9,
                weight="bold" if bold else "normal",
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.75},
                # a label moved away from its point keeps a thin line to it
                arrowprops={"arrowstyle": "-", "color": "#888888", "lw": 0.6} if abs(dy) > 20 else None,
                zorder=4,
            )
            with missing_glyphs_drawn():
                b = label_extent(ann, renderer)
            box = (b.x0, b.y0, b.x1, b.y1)
            free = not any(box[0] < t[2] and t[0] < box[2] and box[1] < t[3] and t[1] < box[3] for t in taken)
            if free or (dx, dy) == _OFFSETS[-1]:
                taken.append(box)
                out.append(ann)
                break
            ann.remove()
    return out


def plot(
    t: Tradeoff, path: Path, *, split: str | None = None, labels: Mapping[str, str] | None = None
) -> Path:
    """Draw ``quality_vs_cost.png``: cost on x, quality on y, intervals on both, frontier, bar; each
    variant in its own colour (:func:`variant_styles`), labels placed apart (:func:`place_labels`)."""
    plt = pyplot()
    st = t.split(split or t.plot_split)
    if st is None:
        raise ConfigError(f"the trade-off has no split '{split}'")
    names = dict(labels or {})
    q, c = display_name(t.quality_metric), cost_display(t.cost_metric)
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    pts = [p for p in st.points if math.isfinite(p.quality) and math.isfinite(p.cost)]
    styles = variant_styles([p.variant for p in st.points], t.baseline)
    front = sorted((p for p in pts if p.frontier), key=lambda p: (p.cost, p.quality))
    if len(front) > 1:
        ax.plot(
            [p.cost for p in front],
            [p.quality for p in front],
            "--",
            color="#777777",
            lw=1.2,
            zorder=1,
            label="Pareto frontier",
        )
    texts = []
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
        colour, marker = styles[p.variant]
        ax.errorbar(
            p.cost,
            p.quality,
            xerr=xerr,
            yerr=yerr,
            fmt=marker,
            color=colour,
            ms=15 if p.baseline else 9,
            mec="black" if p.frontier or p.baseline else colour,
            mfc=colour if p.frontier or p.baseline else "white",  # off the frontier: a hollow marker
            mew=1.0 if p.frontier or p.baseline else 2.0,
            capsize=3,
            elinewidth=1,
            zorder=5 if p.baseline else 3,
            label=names.get(p.variant, p.variant),
        )
        text = names.get(p.variant, p.variant)
        if p.variant == st.choice:
            text += "  (cheapest above bar)"
        texts.append((text, p.cost, p.quality, p.baseline))
    if t.quality_bar is not None:
        ax.axhline(
            t.quality_bar,
            color=PALETTE[5],
            ls=":",
            lw=1.5,
            label=f"quality bar {q} {'>=' if t.quality_higher else '<='} {fmt(t.quality_bar)}",
        )
    level = round(100 * (1 - t.alpha))
    unit = f" ({t.cost_unit})" if t.cost_unit and t.cost_unit not in c else ""
    ax.set_xlabel(f"{c}{unit}  - lower is cheaper")
    ax.set_ylabel(f"{st.split} {q}  - {'higher' if t.quality_higher else 'lower'} is better")
    ax.set_title(
        f"{st.split}: {q} against {c}  ({level}% group-bootstrap intervals; hollow: off the frontier)",
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    ax.margins(x=0.25, y=0.18)
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    place_labels(fig, ax, texts)
    make_dirs(path.parent)
    save_figure(fig, path)
    return path


def plot_recall(
    curves: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]],
    path: Path,
    titles: Mapping[str, str],
    baseline: str,
) -> Path | None:
    """``recall_at_k.png``: one panel per split, k on x, recall on y, one line per variant, each in its
    own colour and marker (:func:`variant_styles`); the legend beside the panels, off the lines."""
    if not curves:
        return None
    plt = pyplot()
    splits = list(curves)
    labels = list(dict.fromkeys(label for split in splits for label in curves[split]))
    styles = variant_styles(labels, baseline)
    fig, axes = plt.subplots(1, len(splits), figsize=(5.2 * len(splits), 3.8), squeeze=False, sharey=True)
    for ax, split in zip(axes[0], splits, strict=True):
        for label, pts in curves[split].items():
            base = label == baseline
            colour, marker = styles[label]
            ax.plot(
                [k for k, _ in pts],
                [y for _, y in pts],
                marker=marker,
                lw=2.4 if base else 1.5,
                ms=10 if base else 6,
                color=colour,
                label=titles.get(label, label),
            )
        ax.set_xticks(sorted({k for pts in curves[split].values() for k, _ in pts}))
        ax.set_xlabel("k (retrieved documents)")
        ax.set_title(f"{split}: recall@k")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("recall@k (mean per query)")
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    make_dirs(path.parent)
    save_figure(fig, path)
    return path
