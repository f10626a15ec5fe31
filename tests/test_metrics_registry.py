"""The metric registry: names, parsing, display, directions and errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_ablate.core.errors import ConfigError, RagAblateError, UnknownNameError
from rag_ablate.metrics.registry import (
    REGISTRY,
    MetricSpec,
    direction_of,
    display_name,
    metric_name,
    parse_metric_name,
    register,
    valid_metric_names,
)
from rag_ablate.metrics.retrieval import retrieval_metrics

BUILTIN = {
    # base: (direction, binary, takes_k)
    "hit": ("higher", True, True),
    "recall": ("higher", False, True),
    "precision": ("higher", False, True),
    "mrr": ("higher", False, True),
    "ndcg": ("higher", False, True),
    "full_recall": ("higher", True, True),
    "evidence_recall": ("higher", False, True),
    "context_tokens": ("lower", False, True),
    "intent_top1": ("higher", True, False),
    "latency_ms": ("lower", False, False),
}



def test_builtin_metrics_are_registered() -> None:
    for base, (direction, binary, takes_k) in BUILTIN.items():
        spec = REGISTRY[base]
        assert spec.base == base
        assert (spec.direction, spec.binary, spec.takes_k) == (direction, binary, takes_k)
        assert spec.description


def test_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        REGISTRY["x"] = REGISTRY["hit"]  # type: ignore[index]


def test_retrieval_keys_are_registered_names() -> None:
    for name in retrieval_metrics(["a"], {"a": 1}, [5]):
        spec, k = parse_metric_name(name)
        assert k == 5 and metric_name(spec.base, k) == name


@pytest.mark.parametrize(
    ("base", "k", "name", "shown"),
    [
        ("recall", 5, "recall_at_5", "recall@5"),
        ("ndcg", 10, "ndcg_at_10", "ndcg@10"),
        ("evidence_recall", 5, "evidence_recall_at_5", "evidence_recall@5"),
        ("context_tokens", 5, "context_tokens_at_5", "context_tokens@5"),
        ("full_recall", 100, "full_recall_at_100", "full_recall@100"),
        ("intent_top1", None, "intent_top1", "intent_top1"),
        ("latency_ms", None, "latency_ms", "latency_ms"),
    ],
)
def test_name_parse_display(base: str, k: int | None, name: str, shown: str) -> None:
    assert metric_name(base, k) == name
    assert parse_metric_name(name) == (REGISTRY[base], k)
    assert parse_metric_name(shown) == (REGISTRY[base], k)
    assert display_name(name) == shown
    assert display_name(f"dev/{name}") == f"dev/{shown}"
    assert display_name(f"holdout/tag=zh/{name}") == f"holdout/tag=zh/{shown}"


@given(base=st.sampled_from(sorted(BUILTIN)), k=st.integers(1, 10_000))
def test_round_trip(base: str, k: int) -> None:
    spec = REGISTRY[base]
    name = metric_name(base, k if spec.takes_k else None)
    parsed_spec, parsed_k = parse_metric_name(name)
    assert parsed_spec is spec
    assert metric_name(parsed_spec.base, parsed_k) == name
    assert parse_metric_name(display_name(name)) == (parsed_spec, parsed_k)
    assert direction_of(name) == spec.direction
    assert direction_of(f"dev/{name}") == spec.direction


def test_direction_of() -> None:
    assert direction_of("recall_at_5") == "higher"
    assert direction_of("dev/context_tokens_at_5") == "lower"
    assert direction_of("holdout/latency_ms") == "lower"
    assert direction_of("intent_top1") == "higher"
    assert direction_of("recall@5") == "higher"


@pytest.mark.parametrize(
    "name",
    [
        "recal_at_5",
        "recall",
        "recall_at_",
        "recall_at_k",
        "recall_at_-1",
        "intent_top1_at_5",
        "intent_top1@1",
        "dev/recall_at_5",
        "Recall_at_5",
        "recall@",
        "",
        "hit_rate@5",
    ],
)
def test_unknown_names_list_valid_names(name: str) -> None:
    with pytest.raises(UnknownNameError) as info:
        parse_metric_name(name)
    message = str(info.value)
    assert f"unknown metric '{name}'" in message
    for typed in ("recall_at_<k>", "ndcg_at_<k>", "intent_top1", "latency_ms", "context_tokens_at_<k>"):
        assert typed in message
    assert info.value.valid == valid_metric_names()
    # the project's error tree, and still a KeyError for dict-like callers
    assert isinstance(info.value, RagAblateError)
    assert isinstance(info.value, KeyError)


def test_unknown_name_everywhere() -> None:
    with pytest.raises(UnknownNameError, match="recall_at_<k>"):
        metric_name("recal", 5)
    with pytest.raises(UnknownNameError, match="recall_at_<k>"):
        display_name("dev/recal_at_5")
    with pytest.raises(UnknownNameError, match="recall_at_<k>"):
        direction_of("dev/recal_at_5")


def test_valid_names_follow_the_registry(scratch_registry: None) -> None:
    assert "rouge_l" not in valid_metric_names()
    register(MetricSpec("rouge_l", "higher", False, False, "ROUGE-L against a reference"))
    register(MetricSpec("bleu", "higher", False, False, "BLEU against a reference"))
    assert "rouge_l" in valid_metric_names()
    with pytest.raises(UnknownNameError) as info:
        parse_metric_name("nope")
    assert "rouge_l" in str(info.value) and "bleu" in str(info.value)
    assert parse_metric_name("rouge_l") == (REGISTRY["rouge_l"], None)
    assert direction_of("dev/rouge_l") == "higher"


def test_extended_registry_is_cleaned_up() -> None:
    assert "rouge_l" not in REGISTRY


def test_duplicate_registration_raises(scratch_registry: None) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(MetricSpec("recall", "higher", False, True, "again"))
    register(MetricSpec("rouge_l", "higher", False, False, "ROUGE-L against a reference"))
    with pytest.raises(ValueError, match="already registered"):
        register(MetricSpec("rouge_l", "lower", False, False, "ROUGE-L against a reference"))
    assert REGISTRY["rouge_l"].direction == "higher"
    with pytest.raises(ValueError, match="already registered"):  # a built-in judged metric
        register(MetricSpec("faithfulness", "lower", False, False, "judge score 0-5"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": "Recall"},
        {"base": "recall@5"},
        {"base": "hit_at_rank"},  # "_at_" is reserved for the cutoff
        {"base": "a__b"},
        {"base": "_x"},
        {"base": ""},
        {"direction": "up"},
        {"binary": 1},
        {"description": " "},
    ],
)
def test_invalid_spec_raises(kwargs: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "base": "new_metric",
        "direction": "higher",
        "binary": False,
        "takes_k": True,
        "description": "something",
    }
    fields.update(kwargs)
    with pytest.raises(ValueError):
        MetricSpec(**fields)  # type: ignore[arg-type]


def test_register_rejects_non_spec() -> None:
    with pytest.raises(TypeError):
        register("recall")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad_k", [0, -3, None, 2.5, True, "5"])
def test_bad_k_for_a_metric_with_cutoff(bad_k: object) -> None:
    with pytest.raises(ConfigError, match="recall"):
        metric_name("recall", bad_k)  # type: ignore[arg-type]


def test_k_for_a_metric_without_cutoff() -> None:
    with pytest.raises(ConfigError, match="takes no cutoff"):
        metric_name("intent_top1", 5)


@pytest.mark.parametrize("name", ["recall_at_0", "recall@0", "recall_at_05", "ndcg@007"])
def test_bad_k_in_a_name(name: str) -> None:
    with pytest.raises(ConfigError, match="positive integer"):
        parse_metric_name(name)


def test_names_are_mlflow_safe() -> None:
    # MLflow allows only letters, digits, "_ - . : /" and spaces in metric keys
    import re

    for base, spec in REGISTRY.items():
        name = metric_name(base, 10 if spec.takes_k else None)
        assert re.fullmatch(r"[A-Za-z0-9_\-.:/ ]+", name)
