"""Names of the files that jobs and sweeps write, defined once.

A job folder (``outputs/runs/<time>/`` or ``<sweep dir>/<job num>/``) holds the
per-query records and everything derived from them; a sweep folder holds the
plan, the sweep's tracking handle and the comparison. Every module that reads or
writes one of these files takes its name from here.
"""

from __future__ import annotations

# a job folder
RECORDS_FILE = "records.jsonl"  # one line per query: the primary data
SUMMARY_FILE = "summary.json"  # label, run id, aggregate metrics, build facts
VARIANT_FILE = "variant.json"  # label, overrides, choices, ablation role, dataset fingerprints
METRICS_FILE = "metrics.json"  # aggregate metrics, as logged to MLflow
CONFIG_FILE = "config.yaml"  # the resolved config of the job
INTENTS_MD = "intents.md"  # per-intent accuracy, worst first
INTENTS_JSON = "intents.json"
SLICES_JSON = "slices.json"  # every metric per tag and per intent (rag_ablate.run.slices)
SLICES_MD = "slices.md"  # the slice table, worst slices first
REPEATS_JSON = "repeats.json"  # system.repeats > 1: each query's mean and SD per metric (records.repeats)
PROFILE_FILE = "profile.json"  # seconds and peak MB per stage (core.profiling); a sweep has one too
RUN_FILE = "run.json"  # written when the job starts: its MLflow run id and config, for resume=
JUDGE_CALIBRATION_JSON = "judge_calibration.json"  # the judge's agreement with human judgements
JUDGE_CALIBRATION_MD = "judge_calibration.md"
REPLAY_UNMATCHED_FILE = "replay_unmatched.jsonl"  # system=replay: log lines that matched no query, and why

# a sweep folder
PLAN_FILE = "plan.json"  # the ablation plan: every job, what it changes
SWEEP_FILE = "sweep.json"  # the parent run id, experiment id and tracking URI
SWEEP_SUMMARY_MD = "summary.md"  # the per-variant table
COMPARISON_JSON = "comparison.json"
COMPARISON_MD = "comparison.md"
FAILURES_FILE = "failures.json"  # jobs and steps of the sweep that failed, with why
PINNED_DIR = "pinned"  # rag-ablate compare SWEEP --baseline-run RUN: that comparison's files and report
TIMING_FILE = "timing.jsonl"  # the interleaved timing pass: one line per query, variant and repeat
CONFIG_COPY_DIR = "config"  # a run's or sweep's copy of the --config-dir folder, for resume= (run.resume)
