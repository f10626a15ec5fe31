"""The comparison step: is a variant really better than the baseline, where, by how much?

Input is what the jobs left on disk (each job folder's ``records.jsonl``,
``variant.json`` and ``config.yaml``) or in MLflow (the same files as artifacts
of a sweep's child runs), never anything held in memory, so it works after any
launcher and can be rerun at will.

Per split (dev, holdout), per variant against the baseline, per metric: the
effect (variant mean - baseline mean over the queries both have a value for),
its group-bootstrap SE and percentile CI, the group sign-flip p-value, and p
adjusted over the split's family (variants x metrics): Holm on holdout
(confirmatory), Benjamini-Hochberg on dev (exploratory). Whether an effect is an
improvement follows the metric's direction; effects are never sign-flipped.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag_ablate import stats
from rag_ablate.config import COMPARE_METRICS
from rag_ablate.errors import ComparisonError
from rag_ablate.metrics import direction_of, display_name, parse_metric_name
from rag_ablate.records import RECORDS_FILE, Record, read_records

DEFAULT_METRICS = COMPARE_METRICS
# continuous metrics without a natural [0, 1] scale: flips are judged by relative change
UNBOUNDED = frozenset({"latency_ms", "context_tokens"})
COMPARISON_JSON = "comparison.json"
COMPARISON_MD = "comparison.md"


@dataclass
class VariantData:
    """One variant as found on disk or in MLflow."""

    label: str
    records: list[Record]
    config: dict[str, Any] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    run_id: str | None = None
    source: str = ""
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    split: str
    variant: str
    metric: str
    direction: str
    baseline_mean: float
    variant_mean: float
    effect: float
    ci_low: float
    ci_high: float
    se: float
    p_value: float
    p_exact: bool
    p_bootstrap: float
    bootstrap_unreliable: bool
    n_queries: int
    n_groups: int
    p_adjusted: float = math.nan
    adjustment: str = ""
    significant: bool = False
    verdict: str = ""  # better | worse | "" (not significant)
    flag: str = ""  # dev and holdout disagree, see _flag_disagreements


@dataclass
class Flip:
    query_id: str
    query: str
    baseline: float
    variant: float


@dataclass
class Comparison:
    baseline: str
    variants: list[str]
    metrics: list[str]
    splits: list[str]
    B: int
    seed: int
    alpha: float
    rows: list[Row]
    flips: dict[str, dict[str, dict[str, dict[str, list[Flip]]]]]  # variant/metric/split/{improved,regressed}
    notes: list[str] = field(default_factory=list)
    confounded: dict[str, list[str]] = field(default_factory=dict)  # variant -> changed factors (guard)

    def row(self, split: str, variant: str, metric: str) -> Row | None:
        for r in self.rows:
            if (r.split, r.variant, r.metric) == (split, variant, metric):
                return r
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "variants": self.variants,
            "metrics": self.metrics,
            "splits": self.splits,
            "B": self.B,
            "seed": self.seed,
            "alpha": self.alpha,
            "notes": self.notes,
            "confounded": self.confounded,
            "rows": [_finite(asdict(r)) for r in self.rows],
            "flips": {
                v: {
                    m: {s: {k: [asdict(f) for f in fl] for k, fl in d.items()} for s, d in bys.items()}
                    for m, bys in bym.items()
                }
                for v, bym in self.flips.items()
            },
        }


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


# --------------------------------------------------------------------------- loading


def load_sweep_dir(sweep_dir: Path) -> list[VariantData]:
    """The variants of a sweep folder, in job order."""
    if not sweep_dir.is_dir():
        raise ComparisonError(f"not a folder: {sweep_dir}")
    found = []
    for rec_path in sorted(sweep_dir.glob(f"*/{RECORDS_FILE}")):
        job = rec_path.parent
        variant_path = job / "variant.json"
        if not variant_path.is_file():
            continue
        info = json.loads(variant_path.read_text(encoding="utf-8"))
        summary_path = job / "summary.json"
        run_id = None
        if summary_path.is_file():
            run_id = json.loads(summary_path.read_text(encoding="utf-8")).get("run_id")
        found.append(
            (
                int(info.get("job_num", 0)),
                VariantData(
                    label=info["label"],
                    records=read_records(rec_path),
                    config=_read_config(job / "config.yaml"),
                    overrides=list(info.get("overrides", [])),
                    run_id=run_id,
                    source=str(job),
                    info=info,
                ),
            )
        )
    if not found:
        raise ComparisonError(f"no finished variants (job folders with records.jsonl) in {sweep_dir}")
    return [v for _, v in sorted(found, key=lambda t: t[0])]


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def load_mlflow_parent(uri: str, parent_run_id: str) -> list[VariantData]:
    """The variants of a sweep's parent run, from its child runs' artifacts."""
    import tempfile

    from rag_ablate import tracking

    children = tracking.child_runs(uri, parent_run_id)
    if not children:
        raise ComparisonError(f"run {parent_run_id} has no child runs in {uri}")
    out = []
    for run_id, name in children:
        tmp = Path(tempfile.mkdtemp(prefix="rag_ablate_cmp_"))
        files = tracking.download(uri, run_id, [RECORDS_FILE, "variant.json", "config.yaml"], tmp)
        if RECORDS_FILE not in files:
            raise ComparisonError(f"child run {run_id} ({name}) has no {RECORDS_FILE} artifact")
        info = (
            json.loads(files["variant.json"].read_text(encoding="utf-8")) if "variant.json" in files else {}
        )
        out.append(
            (
                int(info.get("job_num", 0)),
                VariantData(
                    label=str(info.get("label", name)),
                    records=read_records(files[RECORDS_FILE]),
                    config=_read_config(files["config.yaml"]) if "config.yaml" in files else {},
                    overrides=list(info.get("overrides", [])),
                    run_id=run_id,
                    source=f"mlflow run {run_id}",
                    info=info,
                ),
            )
        )
    return [v for _, v in sorted(out, key=lambda t: t[0])]


def pick_baseline(variants: Sequence[VariantData], baseline: str | None) -> tuple[VariantData, list[str]]:
    """The baseline: named, else the variant labelled or tagged baseline, else the first job."""
    labels = [v.label for v in variants]
    notes: list[str] = []
    if baseline is not None:
        for v in variants:
            if v.label == baseline:
                return v, notes
        raise ComparisonError(
            f"baseline '{baseline}' is not a variant of this sweep; variants: {', '.join(labels)}"
        )
    for v in variants:
        if v.label == "baseline" or v.info.get("role") == "baseline":
            return v, notes
    notes.append(
        f"no variant is marked baseline; using the first job, '{variants[0].label}' (see --baseline)"
    )
    return variants[0], notes


# --------------------------------------------------------------------------- statistics


class _CountCache:
    """One bootstrap draw per split and group set, shared by every variant and metric."""

    def __init__(self, B: int, seed: int) -> None:
        self.B, self.seed = B, seed
        self._cache: dict[tuple[str, str], list[np.ndarray]] = {}

    def get(self, split: str, groups: Sequence[str]) -> list[np.ndarray]:
        uniq = sorted(set(groups))
        digest = hashlib.sha256("\x1f".join(uniq).encode("utf-8")).hexdigest()[:16]
        key = (split, digest)
        if key not in self._cache:
            rng = np.random.default_rng(stats.derive_seed(self.seed, split, digest))
            self._cache[key] = list(stats.bootstrap_counts(len(uniq), self.B, rng))
        return self._cache[key]


def _values(records: Sequence[Record], split: str) -> dict[str, Record]:
    return {r["query_id"]: r for r in records if r["split"] == split}


def compare(
    variants: Sequence[VariantData],
    *,
    baseline: str | None = None,
    metrics: Sequence[str] = DEFAULT_METRICS,
    splits: Sequence[str] = ("dev", "holdout"),
    B: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    flip_threshold: float = 0.2,
) -> Comparison:
    """Compare every variant with the baseline. See the module docstring."""
    for m in metrics:
        parse_metric_name(m)  # unknown names fail with the valid ones
    base, notes = pick_baseline(variants, baseline)
    others = [v for v in variants if v is not base]
    if not others:
        raise ComparisonError("a comparison needs at least one variant besides the baseline")
    counts = _CountCache(B, seed)
    rows: list[Row] = []
    flips: dict[str, dict[str, dict[str, dict[str, list[Flip]]]]] = {}
    for split in splits:
        base_by_id = _values(base.records, split)
        if not base_by_id:
            notes.append(f"the baseline has no queries in split '{split}'")
            continue
        for var in others:
            var_by_id = _values(var.records, split)
            missing = [q for q in base_by_id if q not in var_by_id]
            if missing:
                notes.append(f"{var.label}: {len(missing)} {split} queries of the baseline have no record")
            # metrics measured on the same queries are tested together, on one shared draw
            by_subset: dict[tuple[str, ...], list[str]] = {}
            for m in metrics:
                qids = tuple(
                    q
                    for q, br in base_by_id.items()
                    if q in var_by_id
                    and br["metrics"].get(m) is not None
                    and var_by_id[q]["metrics"].get(m) is not None
                )
                if qids:
                    by_subset.setdefault(qids, []).append(m)
            for qids, ms in by_subset.items():
                b = np.array([[base_by_id[q]["metrics"][m] for m in ms] for q in qids], dtype=np.float64)
                v = np.array([[var_by_id[q]["metrics"][m] for m in ms] for q in qids], dtype=np.float64)
                groups = [str(base_by_id[q]["group"]) for q in qids]
                res = stats.paired_test(
                    b, v, np.array(groups), B=B, seed=seed, alpha=alpha, counts=counts.get(split, groups)
                )
                for j, m in enumerate(ms):
                    rows.append(
                        Row(
                            split=split,
                            variant=var.label,
                            metric=m,
                            direction=direction_of(m),
                            baseline_mean=float(b[:, j].mean()),
                            variant_mean=float(v[:, j].mean()),
                            effect=float(res.effect[j]),
                            ci_low=float(res.ci_low[j]),
                            ci_high=float(res.ci_high[j]),
                            se=float(res.se[j]),
                            p_value=float(res.p_value[j]),
                            p_exact=bool(res.p_exact[j]),
                            p_bootstrap=float(res.p_bootstrap[j]),
                            bootstrap_unreliable=res.bootstrap_unreliable,
                            n_queries=res.n_queries,
                            n_groups=res.n_groups,
                        )
                    )
                    _add_flips(flips, var.label, m, split, qids, b[:, j], v[:, j], base_by_id, flip_threshold)
    _adjust(rows, alpha)
    _flag_disagreements(rows)
    return Comparison(
        baseline=base.label,
        variants=[v.label for v in others],
        metrics=list(metrics),
        splits=list(splits),
        B=B,
        seed=seed,
        alpha=alpha,
        rows=rows,
        flips=flips,
        notes=notes,
    )


def _add_flips(
    flips: dict[str, dict[str, dict[str, dict[str, list[Flip]]]]],
    variant: str,
    metric: str,
    split: str,
    qids: Sequence[str],
    b: np.ndarray,
    v: np.ndarray,
    base_by_id: Mapping[str, Record],
    threshold: float,
) -> None:
    spec, _ = parse_metric_name(metric)
    lower = direction_of(metric) == "lower"
    relative = spec.base in UNBOUNDED
    improved: list[Flip] = []
    regressed: list[Flip] = []
    for q, bv, vv in zip(qids, b, v, strict=True):
        d = float(vv - bv)
        if spec.binary:
            changed = d != 0
        elif relative:
            changed = abs(d) > threshold * max(abs(float(bv)), abs(float(vv)))
        else:
            changed = abs(d) > threshold
        if not changed:
            continue
        f = Flip(q, str(base_by_id[q].get("query", "")), float(bv), float(vv))
        (improved if (d < 0) == lower else regressed).append(f)
    flips.setdefault(variant, {}).setdefault(metric, {})[split] = {
        "improved": improved,
        "regressed": regressed,
    }


def _adjust(rows: list[Row], alpha: float) -> None:
    for split in {r.split for r in rows}:
        family = [r for r in rows if r.split == split]
        p = np.array([r.p_value for r in family])
        if split == "holdout":
            adj, how = stats.holm(p), "holm"
        else:
            adj, how = stats.benjamini_hochberg(p), "bh"
        for r, a in zip(family, adj, strict=True):
            r.p_adjusted = float(a)
            r.adjustment = how
            r.significant = bool(a < alpha) and r.effect != 0
            if r.significant:
                better = (r.effect > 0) == (r.direction == "higher")
                r.verdict = "better" if better else "worse"


def _flag_disagreements(rows: list[Row]) -> None:
    """Flag a variant x metric whose dev and holdout verdicts disagree."""
    by_key: dict[tuple[str, str], dict[str, Row]] = {}
    for r in rows:
        by_key.setdefault((r.variant, r.metric), {})[r.split] = r
    for pair in by_key.values():
        dev, hold = pair.get("dev"), pair.get("holdout")
        if dev is None or hold is None or dev.verdict == hold.verdict:
            continue
        if dev.verdict and hold.verdict:
            flag = "dev and holdout conflict"
        elif dev.verdict:
            flag = f"{dev.verdict} on dev only"
        else:
            flag = f"{hold.verdict} on holdout only"
        dev.flag = hold.flag = flag


# --------------------------------------------------------------------------- regression gate

_RULE = re.compile(
    r"^\s*(?P<split>dev|holdout)/(?P<metric>[A-Za-z0-9_@]+)\s*(?P<op><|>)\s*(?P<bound>[-+]?[0-9.]+)\s*$"
)


@dataclass(frozen=True)
class GateRule:
    split: str
    metric: str
    op: str
    bound: float
    text: str

    @classmethod
    def parse(cls, text: str) -> GateRule:
        m = _RULE.match(text)
        if not m:
            raise ComparisonError(
                f"cannot read --fail-on '{text}'; expected SPLIT/METRIC<BOUND or SPLIT/METRIC>BOUND, "
                "e.g. 'holdout/recall_at_5<-0.02' or 'holdout/latency_ms>50'"
            )
        spec, k = parse_metric_name(m["metric"])
        metric = spec.base if k is None else f"{spec.base}_at_{k}"
        return cls(m["split"], metric, m["op"], float(m["bound"]), text.strip())

    def violated_by(self, row: Row) -> bool:
        if (row.split, row.metric) != (self.split, self.metric) or not row.significant:
            return False
        return row.effect < self.bound if self.op == "<" else row.effect > self.bound


def gate(comparison: Comparison, rules: Sequence[str]) -> list[str]:
    """Messages for every significant effect beyond a bound (empty: the gate passes)."""
    parsed = [GateRule.parse(r) for r in rules]
    failures = []
    for rule in parsed:
        if rule.metric not in comparison.metrics:
            raise ComparisonError(
                f"--fail-on '{rule.text}': metric {rule.metric} is not compared "
                f"(compared: {', '.join(comparison.metrics)})"
            )
        for row in comparison.rows:
            if rule.violated_by(row):
                failures.append(
                    f"{row.variant}: {row.split}/{row.metric} effect {row.effect:+.4f} "
                    f"[{row.ci_low:+.4f}, {row.ci_high:+.4f}] {rule.op} {rule.bound:+g} "
                    f"and significant (p_adj {row.p_adjusted:.4g}) -- rule '{rule.text}'"
                )
    return failures


# --------------------------------------------------------------------------- reports


def _num(v: float) -> str:
    if not math.isfinite(v):
        return "-"
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.3f}"


def _signed(v: float) -> str:
    return f"{v:+.1f}" if abs(v) >= 100 else f"{v:+.3f}"


def _p(v: float) -> str:
    return "-" if not math.isfinite(v) else ("<0.001" if v < 0.001 else f"{v:.3f}")


def _cell(r: Row | None, groups: bool) -> list[str]:
    if r is None:
        return ["-"] * (5 if groups else 4)
    mark = {"better": " +", "worse": " -"}.get(r.verdict, "")
    cells = [
        f"{_num(r.baseline_mean)} -> {_num(r.variant_mean)}",
        f"{_signed(r.effect)} [{_signed(r.ci_low)}, {_signed(r.ci_high)}]",
        _p(r.p_value) + ("" if r.p_exact else "~"),
        _p(r.p_adjusted) + mark,
    ]
    return [*cells, str(r.n_groups)] if groups else cells


def table_rows(c: Comparison, groups: bool = True) -> tuple[list[str], list[list[str]]]:
    """Rows of variant x metric with dev and holdout side by side (``groups``: a column of group counts)."""
    headers = ["variant", "metric"]
    for s in c.splits:
        headers += [f"{s} base -> var", f"{s} effect [95% CI]", f"{s} p", f"{s} p_adj"]
        headers += [f"{s} groups"] if groups else []
    headers.append("flag")
    rows = []
    for v in c.variants:
        for m in c.metrics:
            cells = [v, display_name(m)]
            flag = ""
            for s in c.splits:
                r = c.row(s, v, m)
                cells += _cell(r, groups)
                flag = flag or (r.flag if r else "")
            if v in c.confounded:
                flag = (flag + "; " if flag else "") + "CONFOUNDED: " + ", ".join(c.confounded[v])
            if any(x != "-" for x in cells[2:]):
                rows.append([*cells, flag])
    return headers, rows


def format_terminal(c: Comparison) -> str:
    from rag_ablate.report import format_table

    headers, rows = table_rows(c, groups=False)
    sizes = ", ".join(
        f"{s} {max(r.n_queries for r in c.rows if r.split == s)} queries in "
        f"{max(r.n_groups for r in c.rows if r.split == s)} groups"
        for s in c.splits
        if any(r.split == s for r in c.rows)
    )
    lines = [
        f"comparison against baseline '{c.baseline}' ({sizes}; group bootstrap B={c.B}, group sign-flip p; "
        f"p_adj: Holm on holdout, BH on dev; + better / - worse at alpha {c.alpha}; ~ Monte Carlo p)",
        format_table(headers, rows),
    ]
    if c.metrics:
        first = c.metrics[0]
        for v in c.variants:
            by_split = c.flips.get(v, {}).get(first, {})
            parts = [
                f"{s}: {len(k['improved'])} improved, {len(k['regressed'])} regressed"
                for s, k in by_split.items()
            ]
            if parts:
                lines.append(
                    f"per-query flips of {v} on {display_name(first)}: {'; '.join(parts)} (comparison.md)"
                )
    for v, factors in c.confounded.items():
        lines.append(f"CONFOUNDED: {v} changes {len(factors)} factors at once: {', '.join(factors)}")
    for n in c.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def format_markdown(c: Comparison, max_flips: int = 10) -> str:
    headers, rows = table_rows(c)
    out = [
        f"# Comparison against `{c.baseline}`",
        "",
        f"Paired, group-aware: group bootstrap (B = {c.B}, seed {c.seed}) for SE and 95% CI, group sign-flip "
        f"test for p; p_adj is Holm over variants x metrics on holdout and Benjamini-Hochberg on dev. "
        f"`+` significantly better, `-` significantly worse at alpha {c.alpha} (by the metric's direction); "
        f"`~` marks a Monte Carlo p.",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *("| " + " | ".join(x.replace("|", "\\|") for x in r) + " |" for r in rows),
        "",
    ]
    if c.confounded:
        out += ["## Confounded variants", ""]
        out += [f"- **{v}** changes {len(f)} factors: {', '.join(f)}" for v, f in c.confounded.items()]
        out.append("")
    if c.notes:
        out += ["## Notes", "", *(f"- {n}" for n in c.notes), ""]
    out += ["## Per-query flips", ""]
    for v, by_metric in c.flips.items():
        for m, by_split in by_metric.items():
            for s, kinds in by_split.items():
                imp, reg = kinds["improved"], kinds["regressed"]
                if not imp and not reg:
                    continue
                out.append(f"### {v} · {display_name(m)} · {s}: {len(imp)} improved, {len(reg)} regressed")
                out.append("")
                for label, fl in (("improved", imp), ("regressed", reg)):
                    for f in fl[:max_flips]:
                        out.append(
                            f"- {label}: `{f.query_id}` {_num(f.baseline)} -> {_num(f.variant)}  {f.query}"
                        )
                    if len(fl) > max_flips:
                        out.append(f"- ... {len(fl) - max_flips} more {label} (comparison.json has all)")
                out.append("")
    return "\n".join(out)


def write_outputs(c: Comparison, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    j, md = out_dir / COMPARISON_JSON, out_dir / COMPARISON_MD
    j.write_text(json.dumps(c.to_dict(), ensure_ascii=False, indent=1), encoding="utf-8")
    md.write_text(format_markdown(c), encoding="utf-8")
    return [j, md]


def delta_metrics(c: Comparison, variant: str) -> dict[str, float]:
    """A child run's effects as MLflow metrics: ``delta/holdout/recall_at_5`` and its adjusted p."""
    out = {}
    for r in c.rows:
        if r.variant == variant:
            out[f"delta/{r.split}/{r.metric}"] = r.effect
            out[f"p_adj/{r.split}/{r.metric}"] = r.p_adjusted
    return out
