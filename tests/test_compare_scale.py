"""The comparison at scale (issue 28): a large comparison gives the numbers of the direct computation,
and records are read the same whichever JSON parser reads them.

The comparison streams each bootstrap draw chunk by chunk, finds latency percentiles in a window of
sorted positions and the trade-off's cost percentile the same way; here, on 20,000 queries, every
number is checked against the tests run one by one on the whole draw, written out
(``stats.paired_test(counts=...)`` and percentiles over every position). Speed is measured by
``benchmarks/bench_compare_scale.py``, never asserted here.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
import math
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_ablate.compare import load, stats, tradeoff
from rag_ablate.compare.analysis import compare, split_draw
from rag_ablate.compare.load import load_sweep_dir
from rag_ablate.compare.model import VariantData
from rag_ablate.compare.slim import Piece, SlimFile, line_boundary, read_piece, read_slim
from rag_ablate.config.schema import CompareConfig
from rag_ablate.core.layout import RECORDS_FILE, VARIANT_FILE
from rag_ablate.records.jsonl import RecordsError, read_records
from tests.test_compare import _records

N, B, SEED = 20_000, 120, 3


def _variants() -> list[VariantData]:
    rng = np.random.default_rng(0)
    groups = [f"g{i // 3 if i % 5 else i}" for i in range(N)]  # some near-duplicate triples
    splits = ["holdout" if hashlib.md5(g.encode()).digest()[0] < 77 else "dev" for g in groups]
    quality = rng.beta(4, 2, N)
    out = []
    for job, (label, gain, ms) in enumerate((("baseline", 0.0, 40.0), ("faster", 0.02, 30.0))):
        hit = (rng.random(N) < np.clip(quality + gain, 0, 1)).astype(float)
        latency = rng.lognormal(math.log(ms), 0.4, N).round(1)  # ties included
        records = _records({"hit_at_5": hit.tolist(), "latency_ms": latency.tolist()}, splits, groups)
        out.append(VariantData(label, records, info={"role": "baseline"} if job == 0 else {}))
    return out


def _column(v: VariantData, split: str, metric: str) -> tuple[np.ndarray, list[str]]:
    recs = [r for r in v.records if r["split"] == split]
    return np.array([r["metrics"][metric] for r in recs]), [str(r["group"]) for r in recs]


def _draw(split: str, groups: list[str]) -> list[np.ndarray]:
    """The split's whole draw, written out (the comparison streams it and keeps none)."""
    uniq = sorted(set(groups))
    digest = hashlib.sha256("\x1f".join(uniq).encode("utf-8")).hexdigest()[:16]
    rng = np.random.default_rng(stats.derive_seed(SEED, split, digest))
    return [c.copy() for c in stats.bootstrap_counts(len(uniq), B, rng)]


@pytest.mark.slow
def test_a_large_comparison_gives_the_numbers_of_the_tests_run_on_the_whole_draw() -> None:
    variants = _variants()
    c = compare(variants, metrics=["hit_at_5", "latency_p95_ms", "latency_p50_ms"], B=B, seed=SEED)
    for split in ("dev", "holdout"):
        b, groups = _column(variants[0], split, "hit_at_5")
        v, _ = _column(variants[1], split, "hit_at_5")
        counts = _draw(split, groups)
        want = stats.paired_test(
            b,
            v,
            np.array(groups),
            B=B,
            alpha=c.alpha,
            counts=counts,
            signflip_seed=split_draw(SEED, split, groups).sign_seed,  # the split's one sign stream
        )
        row = c.row(split, "faster", "hit_at_5")
        assert row is not None and row.n_queries == b.size > 5_000
        got = (row.effect, row.se, row.ci_low, row.ci_high, row.p_value, row.boot_ci_low, row.boot_ci_high)
        assert got == (
            want.effect[0],
            want.se[0],
            want.ci_low[0],
            want.ci_high[0],
            want.p_value[0],
            want.boot_ci_low[0],
            want.boot_ci_high[0],
        )
        # the latency percentiles: every resample's percentile over every sorted position
        lb, _ = _column(variants[0], split, "latency_ms")
        lv, _ = _column(variants[1], split, "latency_ms")
        codes = np.unique(np.array(groups), return_inverse=True)[1]
        ob, ov = np.argsort(lb, kind="stable"), np.argsort(lv, kind="stable")
        for metric, q in (("latency_p95_ms", 95.0), ("latency_p50_ms", 50.0)):
            eff = np.concatenate(
                [
                    stats.weighted_percentiles(lv[ov], ch[:, codes[ov]], q)
                    - stats.weighted_percentiles(lb[ob], ch[:, codes[ob]], q)
                    for ch in counts
                ]
            )
            row = c.row(split, "faster", metric)
            assert row is not None
            assert row.effect == np.percentile(lv, q) - np.percentile(lb, q)
            assert [row.ci_low, row.ci_high] == list(np.percentile(eff, [2.5, 97.5]))
            assert row.se == np.std(eff, ddof=1)


@pytest.mark.slow
def test_the_trade_off_cost_percentile_at_scale_equals_the_percentile_over_every_position() -> None:
    variants = _variants()
    settings = CompareConfig(B=B, quality_metric="hit_at_5", cost_metric="latency_p95_ms")
    t = tradeoff.compute(variants, settings, seed=SEED)
    for st in t.splits:
        recs = [[r for r in v.records if r["split"] == st.split] for v in variants]
        index = {g: i for i, g in enumerate(sorted({str(r["group"]) for rs in recs for r in rs}))}
        rng = np.random.default_rng(split_draw(SEED, st.split, index).seed)
        counts = [ch.copy() for ch in stats.bootstrap_counts(len(index), B, rng)]
        for v, rs, point in zip(variants, recs, st.points, strict=True):
            assert point.variant == v.label
            codes = np.array([index[str(r["group"])] for r in rs])
            lat = np.array([r["metrics"]["latency_ms"] for r in rs])
            boot = np.concatenate([tradeoff.weighted_stat(lat, ch[:, codes], 95.0) for ch in counts])
            assert (point.cost_low, point.cost_high) == tuple(np.percentile(boot, [2.5, 97.5]))


def _write_job(folder: Path, lines: list[str], label: str) -> None:
    folder.mkdir(parents=True)
    (folder / VARIANT_FILE).write_text(json.dumps({"label": label, "job_num": int(folder.name)}))
    (folder / RECORDS_FILE).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def test_records_read_alike_whichever_parser_reads_them(tmp_path: Path) -> None:
    """orjson reads most lines; what it refuses (NaN as json.dumps writes it, a number beyond 64
    bits) the json module reads, so no record is lost; a broken line still names file and line."""
    recs: list[dict[str, Any]] = [
        {"query_id": "a", "split": "dev", "group": "g", "status": "ok", "metrics": {"x": 1.5}},
        {"query_id": "b", "split": "dev", "group": "g", "status": "ok", "metrics": {"x": math.nan}},
        {"query_id": "c", "split": "dev", "group": "g", "status": "ok", "metrics": {"x": 2**70}},
        {"query_id": "d", "split": "dev", "group": "g", "status": "ok", "metrics": {"名": "值"}},
    ]
    lines = [json.dumps(r, ensure_ascii=False) for r in recs]
    _write_job(tmp_path / "s" / "0", lines, "baseline")
    _write_job(tmp_path / "s" / "1", list(reversed(lines)), "same outputs")
    got = read_records(tmp_path / "s" / "0" / RECORDS_FILE)
    assert [r["query_id"] for r in got] == ["a", "b", "c", "d"]
    assert math.isnan(got[1]["metrics"]["x"]) and got[2]["metrics"]["x"] == 2**70
    assert got[3]["metrics"] == {"名": "值"} and got[0] == recs[0]
    # the outputs' fingerprint does not depend on the order the queries were written in
    base, other = load_sweep_dir(tmp_path / "s")
    assert base.outputs == other.outputs
    _write_job(tmp_path / "t" / "0", [lines[0], '{"query_id": "x", "metrics": {1.5}}', lines[1]], "bad")
    with pytest.raises(RecordsError, match=r"records.jsonl:2: not a JSON record"):
        read_records(tmp_path / "t" / "0" / RECORDS_FILE)


def test_records_are_read_with_the_cyclic_collector_paused_and_it_is_back_after(tmp_path: Path) -> None:
    """Its full collections walk every record read so far (a quarter of the read at 100,000 queries);
    it is on again after the read, an error included, and stays off if it was off."""
    seen: list[bool] = []

    def project(rec: Any) -> Any:
        seen.append(gc.isenabled())
        return rec

    _write_job(tmp_path / "s" / "0", ['{"query_id": "a"}', '{"query_id": "b"}', "{"], "v")
    path = tmp_path / "s" / "0" / RECORDS_FILE
    assert gc.isenabled()
    with pytest.raises(RecordsError):
        read_records(path, project)
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        (tmp_path / "s" / "0" / RECORDS_FILE).write_text('{"query_id": "a"}\n')
        assert len(read_records(path)) == 1 and not gc.isenabled()
    finally:
        gc.enable()


def _four_jobs(root: Path) -> Path:
    recs: list[dict[str, Any]] = [
        {"query_id": f"q{i}", "split": "dev", "group": f"g{i % 3}", "status": "ok",
         "retrieved": [{"doc_id": f"d{i}", "chunk_id": f"d{i}#0"}] * (i % 4),
         "metrics": {"recall_at_5": i / 7, "hit_at_5": float(i % 2), "n": i, "x": math.nan, "big": 2**70}}
        for i in range(30)
    ]  # fmt: skip
    for job in range(4):
        lines = [json.dumps(dict(r, metrics=dict(r["metrics"], v=job)), ensure_ascii=False) for r in recs]
        _write_job(root / str(job), lines, f"v{job}")
    return root


def _pieces_read(pieces: list[Piece], here: int) -> tuple[list[Any], str]:
    """A file read piece by piece as :func:`load.read_all` reads it: the first ``here`` pieces in
    this process, the others as a worker process sends them (pickled)."""
    file = SlimFile()
    for i, piece in enumerate(pieces):
        if i < here:
            file.read(piece)
        else:
            file.take(pickle.loads(pickle.dumps(read_piece(piece), protocol=pickle.HIGHEST_PROTOCOL)))
    return file.result()


def test_a_file_read_in_pieces_here_and_by_a_worker_is_the_file_read_whole(tmp_path: Path) -> None:
    """A records file cut at line boundaries and read in pieces, some in this process and some sent
    by a worker (number fields as columns): the same records (NaN, -0.0, ints, 2**70, a metrics
    that is not a dict), floats shared across the pieces, the same outputs fingerprint (a query's
    later record in a later piece counts); a broken line in a piece names the file's line."""
    sweep = _four_jobs(tmp_path / "s")
    path = sweep / "1" / RECORDS_FILE
    first = {"query_id": "a", "status": "ok", "metrics": {"s": 0.25}}
    extra = [
        {"query_id": "q3", "status": "error", "metrics": None},
        {"query_id": "z", "metrics": {"a": -0.0, "s": 0.25, "n": 2}},
        {"query_id": "y"},
    ]
    lines = [json.dumps(first), *path.read_text().splitlines(), *map(json.dumps, extra)]
    path.write_text("\n".join(lines) + "\n")
    whole, outputs = read_slim(path)
    size, data = path.stat().st_size, path.read_bytes()
    cuts = [0, line_boundary(path, size // 3), line_boundary(path, 2 * size // 3), size]
    assert data[cuts[1] - 1] == ord("\n") and b"\n" not in data[size // 3 - 1 : cuts[1] - 1]
    pieces = [Piece(path, a, b) for a, b in itertools.pairwise(cuts)]
    for here in (3, 1, 0):
        records, fingerprint = _pieces_read(pieces, here)
        assert fingerprint == outputs
        assert json.dumps([dict(r, retrieved=len(r.get("retrieved") or ())) for r in records]) == json.dumps(
            [dict(r, retrieved=len(r.get("retrieved") or ())) for r in whole]
        )  # NaN, 2**70, ints included
        assert records[0]["metrics"]["s"] is records[-2]["metrics"]["s"]  # first and last pieces
        assert math.copysign(1.0, records[-2]["metrics"]["a"]) == -1.0 and records[-3]["metrics"] is None
        assert "metrics" not in records[-1]
        assert all(e is load.NO_ENTRY for r in records for e in r.get("retrieved") or ())
    lines[25] = '{"query_id": "q24", "metrics": {1.5}}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordsError, match=r"1/records.jsonl:26: not a JSON record"):
        read_piece(Piece(path, line_boundary(path, 2 * size // 3), path.stat().st_size))


def test_the_pieces_give_a_worker_its_share_of_the_bytes_at_line_boundaries(tmp_path: Path) -> None:
    """The files laid end to end, this process reads the first bytes and each worker the next
    share (1 / (n + WORKER_COST) of them: a byte costs a worker WORKER_COST of what it costs this
    process, so all end their reading together), every byte once, each cut at a line's start."""
    sweep = _four_jobs(tmp_path / "s")
    paths = [sweep / str(j) / RECORDS_FILE for j in range(3)]
    total = sum(p.stat().st_size for p in paths)
    for n in (1, 2):
        shares = load.plan_pieces(paths, n)
        assert len(shares) == n + 1
        flat = [piece for share in shares for piece in share]
        for path in paths:  # each file covered once, in order, from its first byte to its last
            mine = [(pc.start, pc.end) for pc in flat if pc.path == path]
            assert mine[0][0] == 0 and mine[-1][1] == path.stat().st_size
            assert all(
                a[1] == b[0] and path.read_bytes()[b[0] - 1] == ord("\n") for a, b in itertools.pairwise(mine)
            )
        share = 1 / (n + load.WORKER_COST)
        for worker in shares[1:]:
            assert sum(pc.end - pc.start for pc in worker) == pytest.approx(share * total, abs=300)
    assert [(pc.path, pc.start) for pc in load.plan_pieces(paths, 1)[1]][1:] == [(paths[2], 0)]


@pytest.mark.slow  # worker processes
def test_a_sweep_read_side_by_side_is_the_sweep_read_one_file_after_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large records files are read side by side (on 2 cores: this process the first bytes, a
    worker process the rest, so that both finish together): the same records, shared floats and
    outputs as read here; a broken line in a worker's file, or in the worker's piece of a file
    shared by both, still names file and line, and a worker that dies leaves its pieces here."""
    sweep = _four_jobs(tmp_path / "s")
    one_by_one = load_sweep_dir(sweep)
    monkeypatch.setattr(load, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(load.os, "cpu_count", lambda: 2)
    started: list[list[Piece]] = []
    start = load.start_worker
    monkeypatch.setattr(load, "start_worker", lambda p: started.append(list(p)) or start(p))
    side_by_side = load_sweep_dir(sweep)
    frozen = gc.get_freeze_count()  # kept out of the collector's sight: the later phases skip them
    gc.unfreeze()
    size = (sweep / "2" / RECORDS_FILE).stat().st_size  # the worker: 1.6 of the 4 files, at their end
    assert [(p.path.parent.name, p.start, p.end) for p in started[0]] == [
        ("2", started[0][0].start, size),
        ("3", 0, size),
    ]
    assert 0 < started[0][0].start < size and len(started) == 1 and frozen > 0
    for a, b in zip(one_by_one, side_by_side, strict=True):
        assert (a.label, a.outputs) == (b.label, b.outputs)
        assert json.dumps([dict(r, retrieved=len(r["retrieved"])) for r in a.records]) == json.dumps(
            [dict(r, retrieved=len(r["retrieved"])) for r in b.records]
        )  # NaN and 2**70 included
        assert b.records[3]["metrics"]["hit_at_5"] is b.records[5]["metrics"]["hit_at_5"]
        assert all(e is load.NO_ENTRY for r in b.records for e in r.get("retrieved") or ())
    broken = (sweep / "3" / RECORDS_FILE).read_text().splitlines()
    broken[4] = '{"query_id": "q4", "metrics": {1.5}}'
    (sweep / "3" / RECORDS_FILE).write_text("\n".join(broken) + "\n")
    with pytest.raises(RecordsError, match=r"3/records.jsonl:5: not a JSON record"):
        load_sweep_dir(sweep)
    shared = (sweep / "2" / RECORDS_FILE).read_text().splitlines()
    shared[28] = "[]"  # in the worker's piece of a file both read
    (sweep / "2" / RECORDS_FILE).write_text("\n".join(shared) + "\n")
    with pytest.raises(RecordsError, match=r"2/records.jsonl:29: not a record"):
        load_sweep_dir(sweep)
    (sweep / "2" / RECORDS_FILE).write_text("\n".join(shared[:28]) + "\n")
    (sweep / "3" / RECORDS_FILE).write_text("\n".join(broken[:4]) + "\n")
    dead = [sys.executable, "-c", "raise SystemExit(1)"]
    monkeypatch.setattr(load, "start_worker", lambda p: subprocess.Popen(dead, stdout=subprocess.PIPE))
    assert [len(v.records) for v in load_sweep_dir(sweep)] == [30, 30, 28, 4]
    gc.unfreeze()


@pytest.mark.parametrize("kwargs", [{}, {"sort_keys": True}, {"indent": None}])
def test_json_written_piece_by_piece_is_the_text_json_dumps_gives(
    kwargs: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rag_ablate.core import fsio

    monkeypatch.setattr(fsio, "_JSON_CHARS", 5)  # many writes
    data = {"a": [1, 2.5, math.nan, "名"], "b": {"c": None, "d": [{"x": True}] * 5}}
    fsio.write_json_atomic(tmp_path / "c.json", data, **kwargs)
    want = json.dumps(data, ensure_ascii=False, **({"indent": 1} | kwargs))
    assert (tmp_path / "c.json").read_text(encoding="utf-8") == want
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]  # no temporary file left
