"""The shapes a RAG service speaks over HTTP (``system.shape``): presets for ``system=http``.

A shape is a full set of defaults: which endpoints are called (``eval_path``, a JSON endpoint;
``chat_path``, a server-sent-events stream), the request body sent to them, and where each field
is found in the responses (:class:`~rag_ablate.config.schema.HttpResponseConfig`). Every
``system.*`` endpoint and ``system.response.*`` path left at ``auto`` takes the shape's value; one
set explicitly (a path, or null for "not reported") wins. README "Evaluate your own RAG service
over HTTP" shows a request and a response of each shape.

* ``reference``: the wire format of ``rag-ablate serve``: evidence and intents from
  ``POST /rag/eval``, the answer streamed by ``POST /rag/chat`` as ``{"delta": ...}`` events ending
  with ``{"done": true, "citations": [...], "usage": {...}}``.
* ``openai_chat_stream``: an OpenAI-compatible chat-completions stream, ``POST
  /v1/chat/completions`` with ``messages``, ``model`` and ``stream: true``; the answer from
  ``choices[0].delta.content``, the end at ``data: [DONE]``, usage from the chunk that carries it.
* ``openai_chat``: the same endpoint without streaming: ``choices[0].message.content`` and ``usage``.
* ``json_answer``: ``POST /answer`` in the wire format, the answer at ``answer`` (no evidence).
* ``single``: one ``POST /rag/query`` returning the answer and its evidence together: ``answer``,
  ``retrieved``, ``citations``, ``usage``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rag_ablate.config.schema import AUTO, HttpResponseConfig, SystemConfig
from rag_ablate.core.errors import ConfigError
from rag_ablate.core.registry import Registry

OPENAI_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Shape:
    """One preset: endpoints, the request body (a template, see ``systems.http.render_body``; built
    from the system settings, for ``{model}``) and every response path (none left at ``auto``)."""

    eval_path: str | None
    chat_path: str | None
    body: Callable[[SystemConfig], dict[str, Any]]
    response: HttpResponseConfig


SHAPES: Registry[Shape] = Registry("system.shape")


def _wire(s: SystemConfig) -> dict[str, Any]:
    return {}  # the wire format: {"query", "query_id", "top_k", "user_groups"?}


def _openai(stream: bool) -> Callable[[SystemConfig], dict[str, Any]]:
    def body(s: SystemConfig) -> dict[str, Any]:
        if s.model is None:
            raise ConfigError(
                f"system.shape={s.shape} sends the model's name: set system.model, e.g. "
                "system.model=gpt-4o-mini (or send a body of your own with system.body)"
            )
        out: dict[str, Any] = {"model": "{model}", "messages": [{"role": "user", "content": "{query}"}]}
        out["stream"] = stream
        if stream:  # ask for the usage chunk before [DONE] (servers that do not know it ignore it)
            out["stream_options"] = {"include_usage": True}
        return out

    return body


_NOTHING = HttpResponseConfig(**{f.name: None for f in dataclasses.fields(HttpResponseConfig)})
_ITEMS = dataclasses.replace(
    _NOTHING,
    retrieved="retrieved",
    doc_id="doc_id",
    chunk_id="chunk_id",
    start="start",
    end="end",
    score="score",
    text="text",
)

SHAPES.add(
    "reference",
    Shape(
        "/rag/eval",
        "/rag/chat",
        _wire,
        dataclasses.replace(
            _ITEMS,
            intents="intentLeafIds",
            timings="timings_ms",
            delta="delta",
            done="done",
            citations="citations",
            usage="usage",
        ),
    ),
)
SHAPES.add(
    "openai_chat_stream",
    Shape(
        None,
        OPENAI_PATH,
        _openai(stream=True),
        dataclasses.replace(_NOTHING, delta="choices.0.delta.content", done_data="[DONE]", usage="usage"),
    ),
)
SHAPES.add(
    "openai_chat",
    Shape(
        OPENAI_PATH,
        None,
        _openai(stream=False),
        dataclasses.replace(_NOTHING, answer="choices.0.message.content", usage="usage"),
    ),
)
SHAPES.add("json_answer", Shape("/answer", None, _wire, dataclasses.replace(_NOTHING, answer="answer")))
SHAPES.add(
    "single",
    Shape(
        "/rag/query",
        None,
        _wire,
        dataclasses.replace(_ITEMS, answer="answer", intents="intents", citations="citations", usage="usage"),
    ),
)


def check_shape(s: SystemConfig) -> SystemConfig:
    """A system=http configuration with its shape resolved (:func:`resolve_shape`), checked: a known
    shape, endpoint paths that start with '/', at least one endpoint, a way to name retrieved items."""
    r = resolve_shape(s)
    for key, path in (("eval_path", r.eval_path), ("chat_path", r.chat_path)):
        if path is not None and not path.startswith("/"):
            raise ConfigError(f"system.{key} must start with '/', got '{path}'")
    if r.eval_path is None and r.chat_path is None:
        raise ConfigError(f"system.shape={s.shape}: system.eval_path and system.chat_path are both null")
    m = r.response
    if r.eval_path is not None and m.retrieved is not None and m.doc_id is None and m.chunk_id is None:
        raise ConfigError(
            "system.response.doc_id and system.response.chunk_id are both null: retrieved items need one"
        )
    return r


def resolve_shape(s: SystemConfig) -> SystemConfig:
    """``s`` with every ``auto`` endpoint and response path, and an empty body, taken from its
    shape (UnknownNameError lists the shapes for an unknown ``system.shape``). Idempotent."""
    shape = SHAPES.get(s.shape)

    def pick(value: str | None, preset: str | None) -> str | None:
        return preset if value == AUTO else value

    response = HttpResponseConfig(
        **{
            f.name: pick(getattr(s.response, f.name), getattr(shape.response, f.name))
            for f in dataclasses.fields(HttpResponseConfig)
        }
    )
    return dataclasses.replace(
        s,
        eval_path=pick(s.eval_path, shape.eval_path),
        chat_path=pick(s.chat_path, shape.chat_path),
        body=dict(s.body) if s.body else shape.body(s),
        response=response,
    )
