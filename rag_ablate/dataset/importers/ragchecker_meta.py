"""RAGChecker's meta-evaluation set: ``human_labeled_data.json`` (or a file or folder of that
layout, e.g. ``/work/shared/data/ragchecker-meta``).

The source is a JSON list with one entry per (instance, annotator): ``instance_id``,
``dataset``, ``query_id``, ``query``, ``gt_answer``, two systems' answers ``model1`` /
``model2`` (``model_name``, ``response``) and the annotator's preference of ``model2`` over
``model1`` on ``correctness_label``, ``completeness_label`` and ``overall_label``, each -2
(model1 much better) to +2 (model2 much better). An instance has one entry per annotator.

Each instance becomes one query ``rcm-<instance_id>``: its reference answer is
``gt_answer``, and its ``human_judgements`` hold one pairwise item per annotator,
``{answers: [model1's, model2's], preference: {correctness, completeness, overall}, rater:
"annotator<k>"}``, where k is the entry's position within the instance in file order (the
source names no annotators; upstream's meta_eval.py pairs them the same way). The source
ships no passages, so the corpus holds one document per instance, its reference answer, which
the query marks relevant: the set is for judging answers, not for measuring retrieval.
``metadata`` keeps the source ids and the two systems' names; the tags are
``ragchecker-meta`` and the source dataset (``kiwi``, ``robustqa/fiqa``, ...).

An empty response stays an empty answer (people judged it); an entry whose texts differ from
its instance's first entry, or whose labels are not integers -2..2, is skipped and reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_ablate.core.errors import DatasetError
from rag_ablate.dataset.importers.common import (
    IMPORTERS,
    Case,
    Importer,
    ImportRun,
    JsonlWriter,
    doc_record,
    nonempty_str,
    read_json,
)
from rag_ablate.dataset.model import HUMAN_PREFERENCE_MAX

ASPECTS = ("correctness", "completeness", "overall")
"""The labelled aspects, read from ``<aspect>_label``."""
_SIDES = ("model1", "model2")


def _files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    files = sorted(source.glob("human_labeled*.json"))
    if not files:
        raise DatasetError(f"no human_labeled*.json in {source}", file=str(source))
    return files


def _texts(entry: dict[str, Any]) -> tuple[str, str, list[str], list[str]] | str:
    """(query, reference answer, the two responses, the two system names), or why not."""
    query, gt = entry.get("query"), entry.get("gt_answer")
    if not isinstance(query, str) or not query.strip():
        return "empty or missing 'query'"
    if not isinstance(gt, str) or not gt.strip():
        return "empty or missing 'gt_answer' (the reference answer)"
    answers: list[str] = []
    names: list[str] = []
    for side in _SIDES:
        obj = entry.get(side)
        response = obj.get("response") if isinstance(obj, dict) else None
        if not isinstance(response, str):
            return f"'{side}.response' is missing or not a string"
        answers.append(response)
        names.append(str(obj.get("model_name") or side) if isinstance(obj, dict) else side)
    return query.strip(), gt, answers, names


def _preference(entry: dict[str, Any]) -> dict[str, int] | str:
    """The entry's labels as ``{aspect: -2..2}``, or why they cannot be used."""
    out: dict[str, int] = {}
    for aspect in ASPECTS:
        v = entry.get(f"{aspect}_label")
        if isinstance(v, bool) or not isinstance(v, int) or abs(v) > HUMAN_PREFERENCE_MAX:
            return f"'{aspect}_label' must be an integer -2..2, got {v!r}"
        out[aspect] = v
    return out


def _import(source: Path, out: JsonlWriter, run: ImportRun) -> list[Case]:
    entries: list[tuple[str, dict[str, Any]]] = []
    for path in _files(source):
        data = read_json(path)
        if not isinstance(data, list):
            raise DatasetError("must be a JSON list of labelled entries", file=str(path))
        for i, entry in enumerate(data):
            where = f"{path.name}[{i}]"
            if not isinstance(entry, dict):
                run.skip(where, "entry skipped", "not a JSON object")
            elif nonempty_str(entry.get("instance_id")) is None:
                run.skip(where, "entry skipped", "missing 'instance_id'")
            else:
                entries.append((where, entry))

    by_instance: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for where, entry in entries:
        by_instance.setdefault(str(nonempty_str(entry["instance_id"])), []).append((where, entry))

    cases: list[Case] = []
    for iid, members in by_instance.items():
        qid = f"rcm-{iid}"
        first_where, first = members[0]
        texts = _texts(first)
        if isinstance(texts, str):
            run.skip(qid, "instance skipped", f"{texts} ({first_where})")
            continue
        query, gt, answers, names = texts
        judgements: list[dict[str, Any]] = []
        for k, (where, entry) in enumerate(members, start=1):
            rater = f"annotator{k}"
            if k > 1 and _texts(entry) != texts:
                run.skip(
                    f"{qid}/{rater}", "judgement skipped", f"its texts differ from {first_where} ({where})"
                )
                continue
            pref = _preference(entry)
            if isinstance(pref, str):
                run.skip(f"{qid}/{rater}", "judgement skipped", f"{pref} ({where})")
                continue
            judgements.append({"answers": answers, "preference": pref, "rater": rater})
        if not judgements:
            run.skip(qid, "instance skipped", "no usable human judgement")
            continue
        if len(members) != 2:
            run.count(f"instances with {len(members)} annotator entries (not 2)")
        if any(not a.strip() for a in answers):
            run.count("instances with an empty response (kept as an empty answer)")
        if answers[0].strip() == answers[1].strip():
            run.count("instances whose two responses are the same text")
        doc_id = f"{qid}-reference"
        dataset = nonempty_str(first.get("dataset"))
        meta: dict[str, Any] = {"source": "ragchecker-meta", "instance_id": first["instance_id"]}
        if dataset:
            meta["dataset"] = dataset
        source_qid = nonempty_str(first.get("query_id"))
        if source_qid:
            meta["query_id"] = source_qid
        out.write(doc_record(doc_id, gt, "reference answer", dict(meta)))
        meta["systems"] = names
        cases.append(
            Case(
                qid,
                query,
                {doc_id: 1},
                [],
                [gt],
                ["ragchecker-meta"] + ([dataset] if dataset else []),
                human_judgements=judgements,
                metadata=meta,
            )
        )
    run.documents = out.count
    return cases


@IMPORTERS.register("ragchecker-meta")
class RagCheckerMeta(Importer):
    """RAGChecker's human-labelled meta-evaluation set (pairwise human preferences)."""

    summary = "RAGChecker meta-evaluation: human_labeled_data.json (two answers, people's preferences)"

    def read(self, source: Path, out: JsonlWriter, run: ImportRun, *, doc_unit: str) -> list[Case]:
        return _import(source, out, run)
