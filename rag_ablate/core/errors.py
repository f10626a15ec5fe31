"""The project's exception tree.

Every error a user can cause is one of these, with a message that says what to
fix. Nothing user-facing is an ``assert`` or a bare traceback.

Every exception class defined anywhere in ``rag_ablate/`` is drawn here, under its parent,
with its module when it is not this one (tests/test_errors_tree.py checks the drawing
against the code)::

    Exception
    ├── RagAblateError                  base of every error raised on purpose
    │   ├── DatasetError                a dataset folder breaks the contract (file, line, field)
    │   │   ├── DatasetValidationError  dataset/model.py: every violation found, in file order
    │   │   └── ReplayError             systems/replay.py: a line of a replayed log (file, line, field)
    │   ├── ConfigError                 a config value or combination is invalid
    │   ├── UnknownNameError            also KeyError: a name not in a registry (lists the valid names)
    │   ├── TrackingError               MLflow store / run problems
    │   │   ├── TrackingDownError       the store stopped answering within tracking.timeout_s mid-run
    │   │   └── WriterError             a call failed in the background MLflow writer's process
    │   ├── ErrorRateError              a stage's share of failed calls/queries is above its error budget
    │   ├── RunStopError                the run stops mid-way: records kept, run FAILED, resume= finishes it
    │   │   ├── EndpointDownError       an endpoint refused or never answered several tries in a row
    │   │   └── SpendLimitError         run/budget.py: the next query would spend past cost.max_usd
    │   ├── ComparisonError             the comparison step cannot be computed
    │   ├── LocalModelError             the offline model (extra [local-llm]) missing, corrupt, not started
    │   ├── JudgeCalibrationError       the judge calibration failed after the run was logged
    │   ├── GenerationError             a generator's model call failed after its retries (with a status)
    │   │   └── _NoAnswer               llm/client.py: a timeout with no response (the breaker counts it)
    │   ├── RecordsError                records/jsonl.py: a records line that is not a record
    │   ├── WriteError                  a file or folder could not be written (disk full, read-only)
    │   └── RerankError                 pipeline/rerank.py: a reranker failed at run time
    ├── _Retry                          llm/client.py: a GenerationError worth sending again
    ├── _Failure                        systems/http.py: a query's call ended with a failure status
    ├── _Retry                          systems/http.py: a _Failure worth sending again
    ├── _RolledBack                     tracking/store.py: a block of MLflow writes in one transaction failed
    └── RequestError                    cli/serve.py: a request body the service cannot use

The five classes under ``Exception`` itself are internal control flow, drawn so the tree is
complete and so nobody mistakes them for user errors: each is caught in the module that raises
it and never reaches a caller. ``_Retry`` and ``_Failure`` become a retry or a query's status
(``timeout``, ``http_error``, ...; a ``_Retry`` that runs out of tries becomes its
``GenerationError`` or ``_Failure``), ``_RolledBack`` makes its block of MLflow writes run again
call by call, and ``RequestError`` becomes the service's HTTP 400 or 422 answer. A new error a
user can see subclasses :class:`RagAblateError`.

Exit codes. Every command exits with one of four codes (README "Exit codes"): ``EXIT_OK`` 0,
``EXIT_FAILED`` 1 (something failed: a query budget, a judge, an endpoint, a job, a step),
``EXIT_INVALID`` 2 (nothing ran: a usage, config, dataset or store error) and ``EXIT_BLOCKED`` 3
(the regression gate blocked). An error's own code is its class's ``exit_code``
(:func:`exit_code_of`): 1 unless the class says nothing ran.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable

from rag_ablate.core.fmt import visible
from rag_ablate.core.retry import Status

EXIT_OK = 0  # the command did its whole job
EXIT_FAILED = 1  # something failed (a budget, a judge, an endpoint, a job, a step)
EXIT_INVALID = 2  # nothing ran: usage, config, dataset or store error
EXIT_BLOCKED = 3  # the regression gate blocked


class RagAblateError(Exception):
    """Base class of all errors raised on purpose by rag_ablate.

    ``exit_code``: what a command that stops on it exits with (``EXIT_FAILED`` unless nothing ran).
    """

    exit_code = EXIT_FAILED


def exit_code_of(exc: BaseException) -> int:
    """The exit code of a command stopped by ``exc``: its class's ``exit_code``, else ``EXIT_FAILED``."""
    return exc.exit_code if isinstance(exc, RagAblateError) else EXIT_FAILED


class DatasetError(RagAblateError):
    """A dataset file breaks the contract in docs/dataset-format.md.

    ``file``, ``line`` (1-based, or None for file-level problems) and ``field``
    say exactly where.
    """

    exit_code = EXIT_INVALID

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.reason = message
        where = file or "<dataset>"
        if line is not None:
            where += f":{line}"
        if field is not None:
            where += f": field '{field}'"
        super().__init__(f"{where}: {message}")


class ConfigError(RagAblateError):
    """A configuration value is invalid or inconsistent."""

    exit_code = EXIT_INVALID


class UnknownNameError(RagAblateError, KeyError):
    """A name that is not in a registry. The message lists the valid names."""

    exit_code = EXIT_INVALID

    def __init__(self, kind: str, name: str, valid: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.valid = sorted(valid)
        msg = f"unknown {kind} '{name}'; valid: {', '.join(self.valid)}"
        super().__init__(msg)

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class TrackingError(RagAblateError):
    """MLflow could not be reached or used as configured."""

    exit_code = EXIT_INVALID


class TrackingDownError(TrackingError):
    """The tracking store stopped answering within ``tracking.timeout_s`` after the run or sweep
    began: it stops with one line naming the store; what it wrote on disk is kept, and ``resume=``
    finishes its runs once the store is back."""

    exit_code = EXIT_FAILED


class WriterError(TrackingError):
    """An MLflow call failed in the background writer's process (rag_ablate.tracking.background),
    after the run's own work was done and kept."""

    exit_code = EXIT_FAILED


class ErrorRateError(RagAblateError):
    """A run finished, was logged and marked FAILED: a stage's share of failed queries or calls
    (the system's queries, the judge's judgements) is above its error budget."""


class RunStopError(RagAblateError):
    """A condition that stops a run between queries: the records so far stay in ``records.jsonl``,
    the MLflow run ends FAILED, the command exits 1, and ``resume=`` finishes the run once the
    cause is gone. Every place that turns a query's error into a failed record lets it through."""


class EndpointDownError(RunStopError):
    """An endpoint (``system=http``, ``generator=openai``, ``judge=openai``, ``rerank=http``) could
    not be connected to, or took the connection and sent no response within its timeout, several
    tries in a row (:class:`rag_ablate.core.retry.Breaker`): the run stops at once instead of
    trying every query. The message names the URL and what the tries met."""


class ComparisonError(RagAblateError):
    """The comparison step cannot be computed from what is on disk."""

    exit_code = EXIT_INVALID


class LocalModelError(RagAblateError):
    """The offline model cannot be prepared or served (rag_ablate/llm/local.py): the extra is not
    installed, a part is missing or corrupt, or the server did not start. Says the fixing command."""

    exit_code = EXIT_INVALID


class JudgeCalibrationError(RagAblateError):
    """The judge calibration step (the dataset's human judgements) failed after the run was logged."""


class WriteError(RagAblateError):
    """A file or folder could not be written (a full disk, a read-only folder, no permission):
    ``path`` and the OS error (``errno``), in one line. What was written before is left as it was
    (:mod:`rag_ablate.core.fsio`). Exit 1, or 2 (``nothing_ran``) when it stops a command before
    anything ran."""

    def __init__(self, path: object, error: OSError, *, nothing_ran: bool = False) -> None:
        self.path = str(path)
        self.errno = error.errno
        self.reason = error.strerror or type(error).__name__
        if nothing_ran:
            self.exit_code = EXIT_INVALID
        code = f" ({errno.errorcode.get(self.errno, self.errno)})" if self.errno is not None else ""
        super().__init__(f"cannot write {self.path}: {self.reason}{code}")

    @property
    def of_the_folder(self) -> bool:
        """The disk or folder refuses every write (full, read-only, no permission), not only this
        file's (a folder in its place): whatever is written next there fails the same way."""
        return self.errno in _FOLDER_ERRNOS


_FOLDER_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type unless it is one of ours, and its first line, with control
    characters escaped (it may quote dataset text, and it is printed to terminals)."""
    text = str(exc).strip().splitlines()
    first = visible(text[0]) if text else ""
    if isinstance(exc, RagAblateError):
        return first or type(exc).__name__
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class GenerationError(RagAblateError):
    """A generator's model call failed (after its retries): the query ends with ``status``
    (``timeout``, ``http_error``, ``access_denied``, ``bad_response``, ``stream_cut``), its
    retrieval kept."""

    def __init__(self, status: Status, message: str, http_status: int | None = None) -> None:
        super().__init__(message)
        self.status: Status = status
        self.http_status = http_status
