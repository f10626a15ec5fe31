"""The Chinese analyzer gives exactly jieba's ``lcut_for_search`` tokens (filtered) from a private
tokenizer, and the analyzer's identity is part of the cache keys.

The reference is a plain ``jieba.Tokenizer`` with the same dictionary, run on the same text.
(tests/test_tokens_fixture.py checks the tokens on the sample against the code before the
tokens were cached.)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from functools import cache
from pathlib import Path

import jieba
import pytest

import rag_ablate.core.cache as cache_mod
from rag_ablate.config.schema import BM25Config
from rag_ablate.pipeline.bm25 import bm25_key_parts
from rag_ablate.pipeline.tokens import tokens_key_parts
from rag_ablate.text import analyzers
from rag_ablate.text.analyzers import ZhSegmenter, analyze_zh, analyzer_key_parts, zh_segmenter

_real_dist_version = cache_mod._dist_version


@cache
def reference() -> Callable[[str], list[str]]:
    jieba.setLogLevel(logging.WARNING)
    tk = jieba.Tokenizer()
    tk.initialize()
    return tk.lcut_for_search


def test_words_added_to_the_global_jieba_do_not_change_the_tokens() -> None:
    text = "退款到账了吗"
    before = zh_segmenter().cut_for_search(text)
    assert before == reference()(text)
    jieba.add_word("退款到账", freq=100000)
    try:
        assert "退款到账" in jieba.lcut_for_search(text)  # the global tokenizer took the word
        assert zh_segmenter().cut_for_search(text) == before  # no cache key records it: ignored
    finally:
        jieba.del_word("退款到账")


def test_a_custom_dictionary_segments_with_it(tmp_path: Path) -> None:
    custom = tmp_path / "dict.txt"
    custom.write_text(
        analyzers.jieba_dictionary().read_text(encoding="utf-8") + "退款到账 50000 n\n", "utf-8"
    )
    seg = ZhSegmenter(custom)
    ref = jieba.Tokenizer(str(custom))
    assert seg.cut_for_search("退款到账了吗") == ref.lcut_for_search("退款到账了吗")
    assert "退款到账" in seg.cut_for_search("退款到账了吗")
    assert "退款到账" not in zh_segmenter().cut_for_search("退款到账了吗")


def test_the_analyzer_filters_jiebas_tokens() -> None:
    text = "请问 iPhone15 Pro 的 3.5mm 耳机孔在哪里？"
    # jieba: 请问 ' ' iPhone15 ' ' Pro ' ' 的 ' ' 3.5 mm ' ' 耳机 孔 在 哪里 ？ (lowercased first)
    assert reference()(text.lower()) == [
        *("请问", " ", "iphone15", " ", "pro", " ", "的", " ", "3.5", "mm", " "),
        *("耳机", "孔", "在", "哪里", "？"),
    ]
    # stop words (请问, 的, 在), spaces and punctuation go
    assert analyze_zh(text) == ["iphone15", "pro", "3.5", "mm", "耳机", "孔", "哪里"]


# --------------------------------------------------------------------------- identity in the keys


def _keys(monkeypatch: pytest.MonkeyPatch, change: Callable[[pytest.MonkeyPatch], None]) -> list[str]:
    chunks = {"corpus": "c" * 16, "size": 512}

    def keys() -> list[str]:
        return [
            cache_mod.content_key("tokens", tokens_key_parts("zh", chunks, True)),
            cache_mod.content_key("bm25", bm25_key_parts(BM25Config(), "zh", chunks, True)),
        ]

    before = keys()
    with monkeypatch.context() as mp:
        change(mp)
        after = keys()
    assert keys() == before
    return [b for b, a in zip(before, after, strict=True) if b != a]


def _library(dist: str) -> Callable[[pytest.MonkeyPatch], None]:
    return lambda mp: mp.setattr(
        cache_mod, "_dist_version", lambda d: "9.9" if d == dist else _real_dist_version(d)
    )


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_library("jieba"), id="jieba version"),
        pytest.param(
            lambda mp: mp.setattr(analyzers, "ZH_STOPWORDS", analyzers.ZH_STOPWORDS | {"退款"}),
            id="stopwords",
        ),
        pytest.param(
            lambda mp: mp.setattr(analyzers, "jieba_dictionary", lambda: Path(cache_mod.__file__)),
            id="dictionary",
        ),
        pytest.param(
            lambda mp: mp.setattr(
                cache_mod,
                "_module_source",
                lambda m: b"# edited" if m == "rag_ablate.text.analyzers" else _real_source(m),
            ),
            id="analyzer code",
        ),
    ],
)
def test_the_tokens_and_index_keys_change_with_the_analyzer(
    change: Callable[[pytest.MonkeyPatch], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(_keys(monkeypatch, change)) == 2


_real_source = cache_mod._module_source


def test_the_analyzer_name_and_bm25_settings_key_what_they_change() -> None:
    chunks = {"corpus": "c" * 16}
    zh, en = tokens_key_parts("zh", chunks, True), tokens_key_parts("en", chunks, True)
    assert zh["analyzer"] == analyzer_key_parts("zh") and en["analyzer"] == analyzer_key_parts("en")
    assert zh["analyzer"]["libraries"] == {"jieba": "0.42.1"}
    assert cache_mod.content_key("tokens", zh) != cache_mod.content_key("tokens", en)
    # every BM25 setting changes the index, none the tokens
    base = BM25Config()
    for field, value in (("k1", 1.2), ("b", 0.3), ("method", "bm25+")):
        other = dataclasses.replace(base, **{field: value})
        assert bm25_key_parts(other, "zh", chunks, True) != bm25_key_parts(base, "zh", chunks, True)
    assert tokens_key_parts("zh", chunks, False) != zh
    with pytest.raises(ValueError, match="resolve analyzer 'auto'"):
        tokens_key_parts("auto", chunks, True)
