"""The comparison step: is a variant really better than the baseline, where, by how much?

Input is what the jobs left on disk (each job folder's ``records.jsonl``,
``variant.json`` and ``config.yaml``) or in MLflow (the same files as artifacts
of a sweep's child runs), never anything held in memory, so it works after any
launcher and can be rerun at will.

Per split (dev, holdout), per variant against the baseline, per metric: the
effect (variant mean - baseline mean over the paired queries), its 95% interval
by inverting the group sign-flip test, the test's p, the group-bootstrap SE and
percentile interval (secondary), and p adjusted over the split's family
(variants x metrics): Holm on holdout (confirmatory), Benjamini-Hochberg on dev
(exploratory). Failed queries are counted, compared (``error_rate``) and timed
(``latency_ms``), never dropped silently. See docs/statistics.md.

Modules: :mod:`.model` (the data), :mod:`.load` (sweep folder, MLflow),
:mod:`.analysis` (the statistics), :mod:`.gate` (``--fail-on``), :mod:`.render`
(terminal, markdown, json) and :mod:`.run` (the whole step, one function).
"""
