"""``judge=openai``: an LLM judge over any OpenAI-compatible chat-completions endpoint.

Everything the judge is told lives in config (conf/judge/openai.yaml): the prompt templates
in English and Chinese (chosen by the question's language), the description of every JSON
key, and a written rubric with one line per score level 0-5 for ``faithfulness``,
``relevance`` and ``completeness``. :func:`judge_prompt_hash` of all of them is the judge's
prompt version.

What the judge sees (:func:`build_prompt`):

* the top ``judge.max_contexts`` contexts, shuffled with a generator seeded by
  ``judge.seed`` and the query id (:func:`shuffled_contexts`: the same order for a query in
  every run, whatever order the queries run in) and renumbered ``[1]..[n]`` in that order;
  the answer's ``[n]`` markers are renumbered to match (a marker naming no shown context
  becomes ``[?]``);
* the reference answers (completeness is asked only when there are some);
* the cited pairs, each as (the answer's sentence, the cited passage's text).

One call per repeat (``repeat`` = 0..judge.repeats-1, each its own model-call cache entry)
asks for one JSON object with the scores, ``refusal`` and ``support``. :func:`parse_reply`
reads it strictly; a reply with any key missing or invalid gets ONE repair message (the
error, and the request for only the JSON); a key still invalid is recorded in that
repeat's ``errors`` and its value is null, never 0. docs/metrics.md "LLM judge" has the
details; :mod:`rag_ablate.judges` the shape of what is returned.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from rag_ablate.config.ranges import check_ranges
from rag_ablate.core.errors import ConfigError, GenerationError
from rag_ablate.core.secrets import hide_userinfo
from rag_ablate.generators.base import Context
from rag_ablate.judges import JUDGE_METRICS, JUDGES, SUPPORT_KEY, JudgeInput, asked_metrics
from rag_ablate.llm.client import ChatClient, ChatResult
from rag_ablate.metrics.answers import answer_sentences
from rag_ablate.records.trace import Judgement, JudgeRepeat, JudgeUsage
from rag_ablate.text.count import is_cjk_text

if TYPE_CHECKING:
    from rag_ablate.config.schema import JudgeConfig, RunConfig
    from rag_ablate.core.cache import Cache

LEVELS = 6  # score levels 0..5
KEYS = (*JUDGE_METRICS, "refusal", "support", "winner")  # keys_en / keys_zh describe each
# the placeholders every template must contain (other known ones are optional)
REQUIRED = {
    "prompt": ("{question}", "{contexts}", "{answer}", "{rubric}", "{keys}"),
    "pairwise": ("{question}", "{contexts}", "{answer_1}", "{answer_2}", "{keys}"),
    "repair": ("{error}", "{keys}"),
    "citation": ("{sentence}", "{passage}"),
}
TEMPLATE_FIELDS = ("prompt", "pairwise", "repair", "citation", "none", "keys", "rubric")
PLACEHOLDERS = (  # every {name} a judge template may hold (fill() leaves other braces alone)
    "question",
    "contexts",
    "references",
    "answer",
    "answer_1",
    "answer_2",
    "citations",
    "rubric",
    "keys",
    "error",
    "i",
    "sentence",
    "passage",
)
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
_MARKERS = re.compile(r"\[(\d+(?:\s*[,，]\s*\d+)*)\]")
_SPACE_BEFORE_STOP = re.compile(r"\s+([.,;:!?])")
_FENCE = re.compile(r"^```(?:json|JSON)?\s*\n?(.*?)\n?\s*```$", re.S)
JSON_MODE = {"type": "json_object"}


# ---------------------------------------------------------------------- config


def judge_prompt_hash(cfg: JudgeConfig) -> str:
    """The judge's prompt version: sha256 (hex, 16 characters) of every template, key
    description and rubric line, in both languages."""
    payload = {
        f"{name}_{lang}": getattr(cfg, f"{name}_{lang}") for name in TEMPLATE_FIELDS for lang in ("en", "zh")
    }
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def validate_judge(cfg: JudgeConfig) -> None:
    """judge=openai: an http(s) base_url, a model, ranges, every template with its placeholders,
    every JSON key described and a rubric of six levels per metric, in both languages.
    The messages name the field."""
    if not cfg.base_url or not cfg.base_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"judge=openai needs judge.base_url starting with http:// or https://, got "
            f"'{hide_userinfo(cfg.base_url or '')}', e.g. judge.base_url=http://127.0.0.1:8080/v1"
        )
    if not cfg.model:
        raise ConfigError("judge=openai needs judge.model, the model name the endpoint serves")
    check_ranges(cfg, "judge")  # mode, counts, timeouts, temperature: the bounds on the schema's fields
    for lang in ("en", "zh"):
        for name, needed in REQUIRED.items():
            template = getattr(cfg, f"{name}_{lang}")
            missing = [p for p in needed if p not in template]
            if missing:
                raise ConfigError(f"judge.{name}_{lang} must contain {' and '.join(missing)}")
        keys: Mapping[str, str] = getattr(cfg, f"keys_{lang}")
        absent = [k for k in KEYS if not str(keys.get(k, "")).strip()]
        if absent:
            raise ConfigError(f"judge.keys_{lang} must describe the JSON keys {', '.join(absent)}")
        if "{n}" not in keys["support"]:
            raise ConfigError(f"judge.keys_{lang}.support must contain {{n}} (the number of cited pairs)")
        rubric: Mapping[str, Sequence[str]] = getattr(cfg, f"rubric_{lang}")
        for metric in JUDGE_METRICS:
            lines = list(rubric.get(metric) or [])
            if len(lines) != LEVELS or not all(str(line).strip() for line in lines):
                raise ConfigError(
                    f"judge.rubric_{lang}.{metric} must hold {LEVELS} non-empty lines (score levels 0 to 5), "
                    f"got {len(lines)}"
                )


# ---------------------------------------------------------------------- what the judge sees


def fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with its ``{name}`` placeholders replaced in one pass (so a question that
    contains ``{answer}`` is not expanded again); placeholders without a value stay as written."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def shuffled_contexts(
    contexts: Sequence[Context], query_id: str, seed: int, max_contexts: int
) -> list[Context]:
    """The top ``max_contexts`` contexts in the judge's order: shuffled by a generator seeded
    with ``seed`` and ``query_id`` (reproducible per query, independent of the run's order)."""
    shown = list(contexts[:max_contexts])
    random.Random(f"{seed}\0{query_id}").shuffle(shown)
    return shown


def renumber(answer: str, order: Sequence[Context]) -> str:
    """The answer's ``[n]`` markers renamed to the judge's numbering of ``order`` (``[?]`` for a
    number that names no context shown)."""
    new = {c.n: i for i, c in enumerate(order, 1)}

    def one(m: re.Match[str]) -> str:
        numbers = [int(p) for p in re.split(r"[,，]", m.group(1))]
        return "[" + ", ".join(str(new[n]) if n in new else "?" for n in numbers) + "]"

    return _MARKERS.sub(one, answer)


def _flat(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class Prompt:
    """One judge prompt: the messages, and what its reply must hold."""

    lang: str  # "en" | "zh"
    text: str
    asked: tuple[str, ...]  # the metrics whose scores are asked
    n_support: int  # length of the support list asked (0: not asked)
    keys: str  # the rendered key descriptions (reused by the repair message)


def language(question: str) -> str:
    return "zh" if is_cjk_text(question) else "en"


def render_keys(cfg: JudgeConfig, lang: str, names: Sequence[str], n_support: int = 0) -> str:
    described: Mapping[str, str] = getattr(cfg, f"keys_{lang}")
    lines = []
    for name in names:
        text = str(described[name]).replace("{n}", str(n_support)) if name == "support" else described[name]
        lines.append(f'- "{name}": {text}')
    return "\n".join(lines)


def render_rubric(cfg: JudgeConfig, lang: str, metrics: Sequence[str]) -> str:
    rubric: Mapping[str, Sequence[str]] = getattr(cfg, f"rubric_{lang}")
    blocks = []
    for metric in metrics:
        lines = [f"{metric}:"] + [
            f"  {level} = {_flat(str(text))}" for level, text in enumerate(rubric[metric])
        ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _references(cfg: JudgeConfig, lang: str, references: Sequence[str]) -> str:
    if not references:
        return str(getattr(cfg, f"none_{lang}"))
    return "\n".join(f"- {_flat(r)}" for r in references)


def _contexts(order: Sequence[Context]) -> str:
    return "\n\n".join(f"[{i}] {_flat(c.text)}" for i, c in enumerate(order, 1))


def build_prompt(cfg: JudgeConfig, inp: JudgeInput) -> Prompt:
    """The pointwise prompt for one answer (see the module docstring)."""
    lang = language(inp.question)
    order = shuffled_contexts(inp.contexts, inp.query_id, cfg.seed, cfg.max_contexts)
    asked = asked_metrics(bool(inp.references))
    sentences = answer_sentences(inp.answer)
    pairs = []
    for i, (index, passage) in enumerate(inp.citations, 1):
        sentence = sentences[index].text if 0 <= index < len(sentences) else ""
        sentence = _SPACE_BEFORE_STOP.sub(r"\1", sentence)  # "30 days [1]." lost its marker: "30 days ."
        pairs.append(
            fill(
                getattr(cfg, f"citation_{lang}"),
                {"i": str(i), "sentence": sentence, "passage": _flat(passage)},
            )
        )
    n_support = len(inp.citations)
    names = [*asked, "refusal"] + (["support"] if n_support else [])
    keys = render_keys(cfg, lang, names, n_support)
    none = str(getattr(cfg, f"none_{lang}"))
    text = fill(
        getattr(cfg, f"prompt_{lang}"),
        {
            "question": inp.question.strip(),
            "contexts": _contexts(order) or none,
            "references": _references(cfg, lang, inp.references),
            "answer": renumber(inp.answer.strip(), order),
            "citations": "\n".join(pairs) or none,
            "rubric": render_rubric(cfg, lang, asked),
            "keys": keys,
        },
    )
    return Prompt(lang, text, asked, n_support, keys)


def build_pairwise_prompt(cfg: JudgeConfig, inp: JudgeInput, answer_1: str, answer_2: str) -> Prompt:
    """The pairwise prompt: two answers, named only "Answer 1" and "Answer 2"."""
    lang = language(inp.question)
    order = shuffled_contexts(inp.contexts, inp.query_id, cfg.seed, cfg.max_contexts)
    keys = render_keys(cfg, lang, ["winner"])
    none = str(getattr(cfg, f"none_{lang}"))
    text = fill(
        getattr(cfg, f"pairwise_{lang}"),
        {
            "question": inp.question.strip(),
            "contexts": _contexts(order) or none,
            "references": _references(cfg, lang, inp.references),
            "answer_1": renumber(answer_1.strip(), order) or none,
            "answer_2": renumber(answer_2.strip(), order) or none,
            "keys": keys,
        },
    )
    return Prompt(lang, text, (), 0, keys)


# ---------------------------------------------------------------------- reading the reply


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def load_object(reply: str) -> dict[str, Any]:
    """The reply as a JSON object. Surrounding whitespace and ONE enclosing Markdown code fence
    (```json ... ```) are tolerated (small models add it even when told not to); nothing else is:
    text before or after the object fails. Raises ValueError saying why."""
    text = reply.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    if not text:
        raise ValueError("the reply is empty, not a JSON object")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(
            f"the reply is not valid JSON ({exc.args[0] if exc.args else exc}): {_show(text)}"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"the reply is JSON but not an object: {_show(value)}")
    return value


def check_score(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= LEVELS - 1:
        raise ValueError(f"not an integer 0-5: {_show(value)}")
    return value


def check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"not true or false: {_show(value)}")
    return value


def check_support(value: Any, n: int) -> list[bool]:
    if not isinstance(value, list):
        raise ValueError(f"not a list of {n} booleans: {_show(value)}")
    if len(value) != n:
        raise ValueError(f"a list of {len(value)} values, expected {n} (one per cited pair)")
    if not all(isinstance(v, bool) for v in value):
        raise ValueError(f"not a list of booleans: {_show(value)}")
    return list(value)


def check_winner(value: Any) -> str:
    """ "1", "2" or "tie" (the integers 1 and 2 are read as "1" and "2")."""
    if isinstance(value, int) and not isinstance(value, bool) and value in (1, 2):
        return str(value)
    if isinstance(value, str) and value.strip().lower() in ("1", "2", "tie"):
        return value.strip().lower()
    raise ValueError(f'not "1", "2" or "tie": {_show(value)}')


@dataclass
class Parsed:
    """The valid values of one reply and, per key that failed, why."""

    values: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def parse_reply(reply: str, names: Sequence[str], n_support: int = 0) -> Parsed:
    """Read the keys ``names`` (metrics, ``refusal``, ``support``, ``winner``) from a reply.

    Strict: a JSON object (see :func:`load_object`); scores integers 0-5 (not 4.0, not "4");
    ``refusal`` a JSON boolean; ``support`` a list of exactly ``n_support`` booleans; ``winner``
    "1", "2" or "tie". A key missing or invalid fails that key only; a reply that is not a
    JSON object fails every key. Keys not asked for are ignored.
    """
    out = Parsed()
    try:
        obj = load_object(reply)
    except ValueError as exc:
        out.errors = {name: str(exc) for name in names}
        return out
    for name in names:
        if name not in obj:
            out.errors[name] = "missing from the reply"
            continue
        value = obj[name]
        try:
            if name in JUDGE_METRICS:
                out.values[name] = check_score(value)
            elif name == "refusal":
                out.values[name] = check_bool(value)
            elif name == "support":
                out.values[name] = check_support(value, n_support)
            elif name == "winner":
                out.values[name] = check_winner(value)
            else:
                raise KeyError(name)
        except ValueError as exc:
            out.errors[name] = str(exc)
    return out


def error_summary(errors: Mapping[str, str]) -> str:
    """What the repair message says went wrong."""
    messages = list(dict.fromkeys(errors.values()))
    if len(messages) == 1 and len(errors) > 1:
        return messages[0]
    return "; ".join(f'"{k}": {v}' for k, v in errors.items())


# ---------------------------------------------------------------------- the judge


@dataclass
class _Asked:
    """One judged prompt after its call and (maybe) its repair."""

    parsed: Parsed
    repaired: bool
    calls: list[ChatResult]  # the calls that answered (none when the first call failed)


def _usage_sum(results: Sequence[ChatResult]) -> JudgeUsage | None:
    usages = [r.usage for r in results if r.usage is not None]
    if not usages:
        return None

    def total(key: str) -> int | None:
        values = [u.get(key) for u in usages]
        return None if any(v is None for v in values) else sum(v for v in values if v is not None)

    return {
        "prompt_tokens": total("prompt_tokens"),
        "completion_tokens": total("completion_tokens"),
        "total_tokens": total("total_tokens"),
    }


class _CallFields(TypedDict):
    """What a judge repeat (and a pairwise order) records of its calls (see JudgeRepeat)."""

    repaired: bool
    cached: bool
    latency_ms: float | None
    usage: JudgeUsage | None
    usage_count: str | None


def _call_fields(asked: _Asked) -> _CallFields:
    calls = asked.calls
    return {
        "repaired": asked.repaired,
        "cached": bool(calls) and all(r.cached for r in calls),
        "latency_ms": sum(r.latency_ms for r in calls) if calls else None,
        "usage": _usage_sum(calls),
        "usage_count": "local" if any(r.usage_count == "local" for r in calls) else None,
    }


class OpenAIJudge:
    """A :class:`~rag_ablate.judges.Judge` over an OpenAI-compatible endpoint."""

    def __init__(self, settings: RunConfig, cache: Cache | None = None) -> None:
        self.cfg = settings.judge
        validate_judge(self.cfg)
        assert self.cfg.base_url is not None and self.cfg.model is not None
        self.model = self.cfg.model
        self.prompt_hash = judge_prompt_hash(self.cfg)
        self.repeats = self.cfg.repeats
        self.mode = self.cfg.mode
        self.client = ChatClient.from_config("judge", self.cfg, cache, settings.seed)

    @property
    def calls(self) -> int:
        """Requests sent to the endpoint, retries and repairs included."""
        return self.client.calls

    def close(self) -> None:
        client = getattr(self, "client", None)  # absent when __init__ raised
        if client is not None:
            client.close()

    def _complete(self, messages: list[dict[str, str]], repeat: int) -> ChatResult:
        return self.client.complete(
            messages,
            temperature=self.cfg.temperature,
            max_tokens=self.cfg.max_tokens,
            repeat=repeat,
            stream=False,
            response_format=dict(JSON_MODE) if self.cfg.json_mode else None,
        )

    def _ask(self, prompt: Prompt, names: Sequence[str], repeat: int) -> _Asked:
        """One call, and one repair call when a key failed; per key the first valid value wins."""
        messages = [{"role": "user", "content": prompt.text}]
        try:
            first = self._complete(messages, repeat)
        except GenerationError as exc:
            return _Asked(Parsed(errors={n: f"the judge call failed: {exc}" for n in names}), False, [])
        parsed = parse_reply(first.text, names, prompt.n_support)
        if not parsed.errors:
            return _Asked(parsed, False, [first])
        repair = fill(
            getattr(self.cfg, f"repair_{prompt.lang}"),
            {"error": error_summary(parsed.errors), "keys": prompt.keys},
        )
        follow_up = [
            *messages,
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": repair},
        ]
        try:
            second = self._complete(follow_up, repeat)
        except GenerationError as exc:
            for name in parsed.errors:
                parsed.errors[name] += f"; the repair call failed: {exc}"
            return _Asked(parsed, True, [first])
        again = parse_reply(second.text, list(parsed.errors), prompt.n_support)
        parsed.values.update(again.values)
        parsed.errors = again.errors
        return _Asked(parsed, True, [first, second])

    def judge_once(self, inp: JudgeInput, repeat: int) -> JudgeRepeat:
        """One repeat's entry of the record's ``judge.repeats`` list."""
        prompt = build_prompt(self.cfg, inp)
        names = [*prompt.asked, "refusal"] + (["support"] if prompt.n_support else [])
        asked = self._ask(prompt, names, repeat)
        values, raw_errors = asked.parsed.values, asked.parsed.errors
        errors = {(SUPPORT_KEY if k == "support" else k): v for k, v in raw_errors.items()}
        return {
            "scores": {m: values.get(m) for m in JUDGE_METRICS},
            "errors": errors,
            "refusal": values.get("refusal"),
            "support": values.get("support"),
            **_call_fields(asked),
        }

    def judge(self, inp: JudgeInput) -> Judgement:
        """``judge.repeats`` independent judgements of one answer (the record's ``judge`` value)."""
        return {
            "model": self.model,
            "prompt_hash": self.prompt_hash,
            "repeats": [self.judge_once(inp, r) for r in range(self.repeats)],
        }

    def pairwise(self, inp_a: JudgeInput, answer_b: str) -> dict[str, Any]:
        """A against B (``inp_a.answer`` is the baseline's), asked in both orders with the names
        hidden; a win only when both orders pick the same answer (see :mod:`rag_ablate.judges`)."""
        orders = []
        for first, answer_1, answer_2 in (("a", inp_a.answer, answer_b), ("b", answer_b, inp_a.answer)):
            second = "b" if first == "a" else "a"
            asked = self._ask(build_pairwise_prompt(self.cfg, inp_a, answer_1, answer_2), ["winner"], 0)
            winner = asked.parsed.values.get("winner")
            verdict = None if winner is None else {"1": first, "2": second, "tie": "tie"}[winner]
            orders.append(
                {
                    "first": first,
                    "verdict": verdict,
                    "error": asked.parsed.errors.get("winner"),
                    **_call_fields(asked),
                }
            )
        verdicts = [o["verdict"] for o in orders]
        if any(v is None for v in verdicts):
            return {"winner": None, "orders": orders, "consistent": None}
        consistent = verdicts[0] == verdicts[1]
        return {"winner": verdicts[0] if consistent else "tie", "orders": orders, "consistent": consistent}


@JUDGES.register("openai")
def openai_judge(settings: RunConfig, cache: Cache | None = None) -> OpenAIJudge:
    """judge=openai: see the module docstring."""
    return OpenAIJudge(settings, cache)
