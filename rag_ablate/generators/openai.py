"""``generator=openai``: answers from any OpenAI-compatible chat-completions endpoint.

One streamed request per query through :class:`rag_ablate.llm.client.ChatClient` (shared with
``judge=openai``; its docstring describes the wire format, retries, usage and the cache):

* ``ttft_ms`` is taken at the first streamed piece of the answer, counted from when the
  first try was sent (retries and their waits count);
* the answer's ``[n]`` markers become citations of the n-th context
  (:func:`citations_from_markers`);
* usage comes from the API's usage fields; a server that sends none gets a local count
  marked ``usage_count="local"``.

The prompt template is config (``generator.prompt_en`` / ``prompt_zh``, chosen by
the query's language); :func:`prompt_hash` of both is the prompt version, reported
as ``generator.prompt_hash``. The key is read from the environment variable that
``generator.api_key_env`` names when a request is sent; it is never stored.

Every successful call is cached in ``<cache dir>/json.sqlite``, kind ``llm_calls`` (keyed by
endpoint, model, the full prompt's sha256, sampling parameters, repeat index): a rerun replays it with the
original call's latency and tokens, flagged ``cached``. See docs/architecture.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rag_ablate.config.ranges import check_ranges
from rag_ablate.core.errors import ConfigError
from rag_ablate.core.secrets import hide_userinfo
from rag_ablate.generators import GENERATORS
from rag_ablate.generators.base import Context, Generation
from rag_ablate.llm.client import CACHE_KIND, ChatClient
from rag_ablate.records.trace import Citation, TokenUsage
from rag_ablate.text.count import is_cjk_text

if TYPE_CHECKING:
    from rag_ablate.config.schema import GeneratorConfig, RunConfig
    from rag_ablate.core.cache import Cache

__all__ = ["CACHE_KIND", "OpenAIGenerator", "build_prompt", "citations_from_markers", "prompt_hash"]

PLACEHOLDERS = ("{question}", "{contexts}")
_MARKER = re.compile(r"\[(\d+(?:\s*[,，]\s*\d+)*)\]")


# ---------------------------------------------------------------------- prompts and citations


def prompt_hash(cfg: GeneratorConfig) -> str:
    """The prompt version: sha256 (hex, 16 characters) of both templates."""
    payload = json.dumps({"en": cfg.prompt_en, "zh": cfg.prompt_zh}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def format_contexts(contexts: Sequence[Context]) -> str:
    """The contexts as the prompt shows them: ``[n] text``, one blank line between two."""
    return "\n\n".join(f"[{c.n}] {' '.join(c.text.split())}" for c in contexts)


def build_prompt(cfg: GeneratorConfig, query_text: str, contexts: Sequence[Context]) -> str:
    """The user message: the template of the query's language with its placeholders filled in."""
    template = cfg.prompt_zh if is_cjk_text(query_text) else cfg.prompt_en
    # one pass, so a question that contains "{contexts}" is not expanded again
    values = {"{question}": query_text, "{contexts}": format_contexts(contexts)}
    return re.sub(r"\{question\}|\{contexts\}", lambda m: values[m.group(0)], template)


def citations_from_markers(answer: str, contexts: Sequence[Context]) -> list[Citation]:
    """The contexts an answer cites with ``[n]`` (also ``[1, 3]``), in order of first mention.

    A number that names no context is ignored (a model may invent one).
    """
    by_n = {c.n: c for c in contexts}
    out: list[Citation] = []
    seen: set[int] = set()
    for m in _MARKER.finditer(answer):
        for part in re.split(r"[,，]", m.group(1)):
            n = int(part)
            if n in by_n and n not in seen:
                seen.add(n)
                out.append(by_n[n].citation())
    return out


def validate_openai(cfg: GeneratorConfig) -> None:
    """generator=openai needs an http(s) base_url, a model, both prompts with their placeholders."""
    if not cfg.base_url or not cfg.base_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"generator=openai needs generator.base_url starting with http:// or https://, got "
            f"'{hide_userinfo(cfg.base_url or '')}', e.g. generator.base_url=http://127.0.0.1:8080/v1"
        )
    if not cfg.model:
        raise ConfigError("generator=openai needs generator.model, the model name the endpoint serves")
    for key in ("prompt_en", "prompt_zh"):
        template = getattr(cfg, key)
        missing = [p for p in PLACEHOLDERS if p not in template]
        if missing:
            raise ConfigError(f"generator.{key} must contain {' and '.join(missing)}")
    check_ranges(cfg, "generator")  # max_tokens, timeout, retries, temperature: the schema's bounds


# ---------------------------------------------------------------------- the generator


class OpenAIGenerator:
    """A :class:`~rag_ablate.generators.base.Generator` over an OpenAI-compatible endpoint."""

    def __init__(self, settings: RunConfig, cache: Cache | None = None) -> None:
        self.cfg = settings.generator
        validate_openai(self.cfg)
        assert self.cfg.base_url is not None and self.cfg.model is not None
        self.model = self.cfg.model
        self.prompt_hash = prompt_hash(self.cfg)
        self.client = ChatClient.from_config("generator", self.cfg, cache, settings.seed)
        self.url = self.client.url

    @property
    def calls(self) -> int:
        """Requests sent to the endpoint, retries included."""
        return self.client.calls

    def close(self) -> None:
        """Close the connection pool (a later call opens a new one)."""
        client = getattr(self, "client", None)  # absent when __init__ raised
        if client is not None:
            client.close()

    def generate(self, query_text: str, contexts: list[Context], *, repeat: int = 0) -> Generation:
        """Answer one query; ``repeat`` selects an independent sample (its own cache entry)."""
        prompt = build_prompt(self.cfg, query_text, contexts)
        result = self.client.complete(
            [{"role": "user", "content": prompt}],
            temperature=self.cfg.temperature,
            max_tokens=self.cfg.max_tokens,
            repeat=repeat,
            stream=True,
        )
        return Generation(
            answer=result.text,
            citations=citations_from_markers(result.text, contexts),
            usage=None if result.usage is None else TokenUsage.from_dict(result.usage),
            ttft_ms=result.ttft_ms,
            cached=result.cached,
            usage_count=result.usage_count,
            latency_ms=result.latency_ms,
        )


@GENERATORS.register("openai")
def openai_generator(settings: RunConfig, cache: Cache | None = None) -> OpenAIGenerator:
    """generator=openai: see the module docstring."""
    return OpenAIGenerator(settings, cache)
