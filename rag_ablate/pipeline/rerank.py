"""Rerankers: re-score a query's retrieved passages and keep the best ``top_k``.

Every reranker follows :class:`Reranker`: ``rerank(query, passages, top_k)``
returns ``(index into passages, score)`` pairs, best first, at most ``top_k``,
with equal scores ordered by the lower index (so results are deterministic).

* :class:`HttpReranker` (``http``) calls a rerank service that speaks the shape
  common rerank APIs share: ``POST {"query", "documents", "top_n"[, "model"]}``
  answered by ``{"results": [{"index", "relevance_score"}, ...]}`` (``"data"``
  and ``"score"`` are accepted as well). Transient failures are retried.
* :class:`CrossEncoderReranker` (``cross_encoder``) scores (query, passage)
  pairs with a local sentence-transformers ``CrossEncoder`` folder, on CPU,
  never downloading anything. Its scores are the model's raw logits.
* ``biencoder`` re-scores with the cosine of an encoder's embeddings (from the
  cache), so it is built by the pipeline (:class:`BiEncoderStage`);
  :func:`make_reranker` builds the others from their settings.

Each ``rerank.method`` is registered in :data:`RERANKERS` as a factory of a
pipeline stage (:class:`~rag_ablate.pipeline.stages.RerankStage`).

Runtime failures raise :class:`RerankError`; bad settings raise ``ConfigError``.
"""

from __future__ import annotations

import inspect
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from rag_ablate.core.errors import ConfigError, EndpointDownError, RagAblateError
from rag_ablate.core.retry import Breaker, backoff_wait, excerpt, retry_after_seconds, status_meaning
from rag_ablate.core.secrets import hide_userinfo, split_userinfo
from rag_ablate.pipeline.encoders import resolve_encoder
from rag_ablate.pipeline.stages import RERANKERS, Embedded, Hits, QueryState, Resources

if TYPE_CHECKING:  # httpx is imported when a rerank service is used, not when the registry lists it
    import httpx
    from sentence_transformers import CrossEncoder

    from rag_ablate.config.schema import RunConfig

MAX_WAIT_SECONDS = 5.0  # cap on one wait between retries (backoff or Retry-After)

CROSS_ENCODER_HINT = "no cross-encoder ships offline: point rerank.model_path at a local CrossEncoder folder"


class RerankError(RagAblateError):
    """A reranker failed at run time (service error, malformed answer, model failure).

    ``status`` is the HTTP status of the last answer, or None when there was
    none (connection error, timeout) or the reranker is not HTTP.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


@runtime_checkable
class Reranker(Protocol):
    name: str

    def rerank(self, query: str, passages: Sequence[str], top_k: int) -> list[tuple[int, float]]:
        """Indices into ``passages`` with their scores, best first, at most ``top_k``."""
        ...


def _check_top_k(top_k: int) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ConfigError(f"rerank top_k must be an integer >= 1, got {top_k!r}")


def _best(scored: Iterable[tuple[int, float]], top_k: int) -> list[tuple[int, float]]:
    """Sort by score descending, index ascending; keep ``top_k``."""
    return sorted(scored, key=lambda p: (-p[1], p[0]))[:top_k]


def _excerpt(body: str) -> str:
    return excerpt(body) or "<empty body>"


def _sleep(seconds: float) -> None:
    """Wait between retries (a seam for tests)."""
    time.sleep(seconds)


def _transient() -> tuple[type[Exception], ...]:
    """Transport errors worth another try: the service may be restarting or overloaded."""
    import httpx

    return (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


class HttpReranker:
    """A rerank service over HTTP (one ``httpx.Client`` per instance, reused).

    Requests carry ``Authorization: Bearer $<api_key_env>`` when ``api_key_env``
    is set. Connection errors, timeouts, 429 and 5xx answers are retried up to
    ``max_retries`` times, waiting the answer's Retry-After (seconds or an HTTP
    date), else ``backoff_seconds * 2**retry`` with jitter (50-100% of it, drawn
    from ``random.Random(seed)``), at most 5 s per wait
    (:func:`rag_ablate.core.retry.backoff_wait`); any other non-2xx answer fails
    at once. A ``client`` passed in is used as is and not closed by
    :meth:`close`; ``timeout`` applies to every request either way. A service that cannot be
    connected to, or that takes the connection and sends no response within ``timeout``, several
    tries in a row (:class:`rag_ablate.core.retry.Breaker`) raises
    :class:`~rag_ablate.core.errors.EndpointDownError`, which stops the run.
    """

    name: str = "http"
    backoff_seconds: float = 0.25  # first wait between attempts; doubles after each retry

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        timeout: float = 30.0,
        api_key_env: str | None = None,
        max_retries: int = 2,
        seed: int = 0,
        client: httpx.Client | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            shown = hide_userinfo(str(url))
            raise ConfigError(f"rerank.url must be an http:// or https:// URL, got {shown!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ConfigError(f"rerank.timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"rerank max_retries must be an integer >= 0, got {max_retries!r}")
        if model is not None and not isinstance(model, str):
            raise ConfigError(f"rerank.model must be a string, got {model!r}")
        # a user and password in the URL are sent as basic auth, never named with the URL
        self.url, self._userinfo = split_userinfo(url)
        self.model = model
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self._rng = random.Random(seed)  # backoff jitter only
        self.breaker = Breaker("rerank", self.url, ("rerank.timeout", self.timeout))
        self._headers = {"Accept": "application/json"}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if key is None:
                raise ConfigError(
                    f"rerank.api_key_env names the environment variable '{api_key_env}', which is not set"
                )
            if not key.strip():
                raise ConfigError(f"the environment variable '{api_key_env}' (rerank.api_key_env) is empty")
            self._headers["Authorization"] = f"Bearer {key.strip()}"
        self._owns_client = client is None
        if client is None:
            import httpx

            client = httpx.Client(timeout=self.timeout, auth=self._userinfo)
        self._client = client

    def __repr__(self) -> str:
        return f"HttpReranker(url={self.url!r}, model={self.model!r})"

    def close(self) -> None:
        """Close the connection pool (only when this instance created the client)."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> HttpReranker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def rerank(self, query: str, passages: Sequence[str], top_k: int) -> list[tuple[int, float]]:
        _check_top_k(top_k)
        if not passages:
            return []
        if self._client.is_closed:
            raise RerankError(f"the HTTP reranker for {self.url} was closed; build a new one")
        documents = list(passages)
        payload: dict[str, Any] = {
            "query": query,
            "documents": documents,
            "top_n": min(top_k, len(documents)),
        }
        if self.model is not None:
            payload["model"] = self.model
        response = self._post(payload)
        return _best(self._parse(response, len(documents)), top_k)

    def _wait(self, retry: int, response: httpx.Response | None) -> float:
        hinted = None if response is None else retry_after_seconds(response.headers.get("Retry-After"))
        return backoff_wait(retry, hinted, self.backoff_seconds, MAX_WAIT_SECONDS, self._rng)

    def _post(self, payload: dict[str, Any]) -> httpx.Response:
        import httpx

        transient = _transient()
        attempt = 0
        while True:
            attempt += 1
            last = attempt > self.max_retries
            tries = f"{attempt} attempt{'s' if attempt > 1 else ''}"
            if self.breaker.open:
                raise EndpointDownError(self.breaker.message())
            try:
                response = self._client.post(
                    self.url, json=payload, headers=self._headers, timeout=self.timeout
                )
            except transient as exc:
                unreachable = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                silent = isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout)  # connected, no response
                error = f"{type(exc).__name__}: {exc}"
                if (unreachable or silent) and self.breaker.failed(error, silent=silent):
                    raise EndpointDownError(self.breaker.message()) from exc
                if last:
                    raise RerankError(
                        f"rerank request to {self.url} failed after {tries}: {type(exc).__name__}: {exc}",
                        status=None,
                    ) from exc
                _sleep(self._wait(attempt - 1, None))
                continue
            except httpx.HTTPError as exc:  # not transient (unsupported scheme, proxy error, ...)
                raise RerankError(
                    f"rerank request to {self.url} failed: {type(exc).__name__}: {exc}", status=None
                ) from exc
            self.breaker.succeeded()
            status = response.status_code
            meaning = status_meaning(status)
            if meaning is None:
                return response
            if meaning[1] and not last:  # 429 and 5xx may pass on another try
                _sleep(self._wait(attempt - 1, response))
                continue
            raise RerankError(
                f"rerank request to {self.url} failed with HTTP {status} after {tries}: "
                f"{_excerpt(response.text)}",
                status=status,
            )

    def _parse(self, response: httpx.Response, n_docs: int) -> list[tuple[int, float]]:
        status = response.status_code

        def bad(problem: str) -> RerankError:
            return RerankError(
                f"malformed rerank response from {self.url} (HTTP {status}): {problem}; "
                f"body: {_excerpt(response.text)}",
                status=status,
            )

        try:
            body = response.json()
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            raise bad("the body is not JSON") from None
        if not isinstance(body, dict):
            raise bad("the body is not a JSON object")
        items = body.get("results")
        if not isinstance(items, list):
            items = body.get("data")
        if not isinstance(items, list):
            raise bad("no 'results' (or 'data') list")
        seen: set[int] = set()
        out: list[tuple[int, float]] = []
        for pos, item in enumerate(items):
            if not isinstance(item, dict):
                raise bad(f"results[{pos}] is not an object")
            index = item.get("index")
            if isinstance(index, bool) or not isinstance(index, int):
                raise bad(f"results[{pos}] has no integer 'index'")
            score = item["relevance_score"] if "relevance_score" in item else item.get("score")
            if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
                raise bad(f"results[{pos}] has no finite number 'relevance_score' (or 'score')")
            if not 0 <= index < n_docs:
                raise bad(f"results[{pos}] index {index} is out of range for {n_docs} documents")
            if index in seen:
                raise bad(f"results[{pos}] repeats index {index}")
            seen.add(index)
            out.append((index, float(score)))
        return out


class CrossEncoderReranker:
    """A local sentence-transformers ``CrossEncoder`` folder, run on CPU, offline.

    Scores are the raw model outputs (logits, no sigmoid) of (query, passage)
    pairs, from one ``predict`` call per :meth:`rerank`. The model must have a
    single output (``num_labels == 1``), as rerank cross-encoders do.
    """

    name: str = "cross_encoder"

    def __init__(self, model_path: str, *, batch_size: int = 32, max_length: int = 512) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"cross-encoder batch_size must be an integer >= 1, got {batch_size!r}")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ConfigError(f"cross-encoder max_length must be an integer >= 1, got {max_length!r}")
        if not model_path:
            raise ConfigError(f"rerank.model_path is not set; {CROSS_ENCODER_HINT}")
        folder = Path(model_path).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"cross-encoder folder '{folder}' does not exist; {CROSS_ENCODER_HINT}")
        if not (folder / "config.json").is_file():
            raise ConfigError(f"'{folder}' is not a model folder (no config.json); {CROSS_ENCODER_HINT}")
        self.model_path = str(folder)
        self.batch_size = batch_size
        self.max_length = max_length

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from sentence_transformers import CrossEncoder

        try:
            model = CrossEncoder(
                str(folder),
                device="cpu",
                local_files_only=True,
                max_length=max_length,
                activation_fn=torch.nn.Identity(),  # raw logits
            )
        except Exception as exc:  # loading fails in many ways (OSError, ValueError, KeyError, ...)
            raise ConfigError(
                f"cannot load a cross-encoder from '{folder}': {type(exc).__name__}: {exc}; "
                f"{CROSS_ENCODER_HINT}"
            ) from exc
        if model.num_labels != 1:
            raise ConfigError(
                f"the model in '{folder}' has {model.num_labels} outputs; a rerank cross-encoder has one "
                "(num_labels=1)"
            )
        positions = getattr(model.config, "max_position_embeddings", None)
        if isinstance(positions, int) and max_length > positions:
            raise ConfigError(
                f"cross-encoder max_length={max_length} exceeds the {positions} positions "
                f"of the model in '{folder}'"
            )
        self.model: CrossEncoder = model

    def __repr__(self) -> str:
        return f"CrossEncoderReranker(model_path={self.model_path!r})"

    def rerank(self, query: str, passages: Sequence[str], top_k: int) -> list[tuple[int, float]]:
        _check_top_k(top_k)
        if not passages:
            return []
        pairs = [(query, passage) for passage in passages]
        try:
            raw = self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False)
        except (RuntimeError, ValueError, IndexError) as exc:
            raise RerankError(
                f"cross-encoder '{self.model_path}' failed: {type(exc).__name__}: {exc}"
            ) from exc
        scores = np.asarray(raw, dtype=np.float64)
        if scores.ndim == 2 and scores.shape[1] == 1:
            scores = scores[:, 0]
        if scores.shape != (len(pairs),):
            raise RerankError(
                f"cross-encoder '{self.model_path}' returned scores of shape {scores.shape} "
                f"for {len(pairs)} pairs"
            )
        if not np.all(np.isfinite(scores)):
            bad = [int(i) for i in np.flatnonzero(~np.isfinite(scores))[:5]]
            raise RerankError(
                f"cross-encoder '{self.model_path}' returned non-finite scores for passages {bad}"
            )
        return _best(((i, float(s)) for i, s in enumerate(scores)), top_k)


# rerankers of passage texts that make_reranker builds from keyword settings
_PASSAGE_RERANKERS: dict[str, type[HttpReranker] | type[CrossEncoderReranker]] = {
    "http": HttpReranker,
    "cross_encoder": CrossEncoderReranker,
}


def make_reranker(method: str, **kwargs: Any) -> Reranker | None:
    """Build the reranker named ``method`` (see :data:`RERANKERS`) from its settings.

    ``none`` gives None. ``biencoder`` is built by the pipeline from its dense
    encoder, so asking for it here is a ConfigError.
    """
    RERANKERS.check(method)
    if method == "none":
        return None
    factory = _PASSAGE_RERANKERS.get(method)
    if factory is None:
        raise ConfigError(f"the {method} reranker is built by the pipeline from its encoder")
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"rerank={method}: {exc}") from exc
    return factory(**kwargs)


# --------------------------------------------------------------------------- pipeline stages


@RERANKERS.register("none")
def no_reranker(settings: RunConfig) -> None:
    """``rerank=none``: the retriever's top ``retrieval.top_k`` is the final list."""
    return None


class PassageRerankStage:
    """Hands the candidates' texts to a :class:`Reranker` built at prepare time."""

    def __init__(self, build: Callable[[], Reranker]) -> None:
        self._build = build
        self.reranker: Reranker | None = None
        self.texts: Sequence[str] = []  # the chunks' indexed texts (a lazy sequence)

    def prepare(self, res: Resources) -> dict[str, Any]:
        self.texts = res.texts()
        self.reranker = self._build()
        return {}

    def rerank(self, state: QueryState, hits: Hits, top_k: int) -> Hits:
        if self.reranker is None:
            raise RuntimeError("the reranker is used before prepare()")
        if not hits:
            return []
        idx = [i for i, _ in hits]
        ranked = self.reranker.rerank(state.query.query, [self.texts[i] for i in idx], top_k)
        return [(idx[j], float(score)) for j, score in ranked]

    def close(self) -> None:
        close = getattr(self.reranker, "close", None)
        if callable(close):
            close()


@RERANKERS.register("http")
def http_stage(settings: RunConfig) -> PassageRerankStage:
    """``rerank=http``: a rerank service at ``rerank.url``."""
    rr = settings.rerank
    if not rr.url:
        raise ConfigError("rerank=http needs rerank.url")
    url = rr.url
    return PassageRerankStage(
        lambda: HttpReranker(
            url, model=rr.model, timeout=rr.timeout, api_key_env=rr.api_key_env, seed=settings.seed
        )
    )


@RERANKERS.register("cross_encoder")
def cross_encoder_stage(settings: RunConfig) -> PassageRerankStage:
    """``rerank=cross_encoder``: a local CrossEncoder folder at ``rerank.model_path``."""
    path = settings.rerank.model_path
    if not path:
        raise ConfigError("rerank=cross_encoder needs rerank.model_path (a local CrossEncoder folder)")
    return PassageRerankStage(lambda: CrossEncoderReranker(path))


@RERANKERS.register("biencoder")
class BiEncoderStage:
    """``rerank=biencoder``: re-scores candidates by the cosine of ``rerank.encoder`` embeddings.

    Ties go to the lower ``tiebreak``; the query's share of encoding is charged
    once even when the dense retriever uses the same encoder.
    """

    def __init__(self, settings: RunConfig) -> None:
        self.encoder = settings.rerank.encoder
        self.passages = np.zeros((0, 0), dtype=np.float32)
        self.queries: Embedded | None = None
        self.tiebreak = np.zeros(0, dtype=np.int64)

    def prepare(self, res: Resources) -> dict[str, Any]:
        name = resolve_encoder(self.encoder, res.language)
        emb = res.embeddings(name)
        self.passages, self.queries, self.tiebreak = emb.passages, emb.queries, res.tiebreak
        return {"rerank.encoder_resolved": name, "rerank.model_id": emb.model_id}

    def rerank(self, state: QueryState, hits: Hits, top_k: int) -> Hits:
        if self.queries is None:
            raise RuntimeError("the biencoder reranker is used before prepare()")
        state.charge_encoding(self.queries)
        if not hits:
            return []
        idx = [i for i, _ in hits]
        scores = self.passages[idx] @ self.queries.get(state.query.query_id)
        order = sorted(range(len(idx)), key=lambda j: (-float(scores[j]), int(self.tiebreak[idx[j]])))
        return [(idx[j], float(scores[j])) for j in order[:top_k]]

    def close(self) -> None:
        """Nothing to release."""
