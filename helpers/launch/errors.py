"""A rank's failure, as both launchers record it, pick its root cause and raise it in the caller.

The names: `RankError` is what a caller catches (any rank's failure); `RankFailedError` is the RankError
raised for a rank whose exception did not come back; `RankExceptionRecord` is what a rank writes when its
function raises; `RankExitStatus` is what the launcher knows of a rank that ended without writing one.

* A rank whose function raises records a `RankExceptionRecord` (a typed record: rank, attempt, time, host,
  pid, the exception's text and traceback, the exception itself pickled when it can be), in a file
  (local) or with the collector actor (Ray).
* `root_cause` picks the failure that ended the job, by one rule for both launchers (after torch
  elastic's `ProcessFailure` timestamps): of the last attempt, the earliest exception that is not a
  KeyboardInterrupt, since ranks stopped because a peer died raise later than the peer did.
* `rebuild_exception` raises it in the caller as an instance of the original's own class that is also
  a `RankError` (after Ray's `RayTaskError.as_instanceof_cause`): `except ValueError` and
  `except RankError` both catch it, it keeps the original's attributes, and it adds `rank`,
  `world_size` and `remote_traceback`.
* A rank that died without a Python exception (a signal, the OOM killer, a lost node) raises
  `RankFailedError`, itself a `RankError`.
"""

from __future__ import annotations

import os
import pickle
import socket
import time
import traceback
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle


class RankError(Exception):
    """Base class of every error that says "a rank failed": catch it to handle any rank's failure.

    `rank` is the failing rank (None when unknown), `world_size` the number of ranks, and
    `remote_traceback` the rank's own traceback (None when the rank raised no Python exception).
    """

    rank: int | None = None
    world_size: int | None = None
    remote_traceback: str | None = None


class RankFailedError(RankError, RuntimeError):
    """A rank died without a Python exception that could be brought back (killed by a signal, for example)."""

    def __init__(self, message: str, rank: int | None = None, exitcode: int | None = None,
                 world_size: int | None = None):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.world_size = world_size


@dataclass(frozen=True)
class RankExceptionRecord:
    """What a rank records when its function raises: enough to rebuild the exception in the caller."""

    rank: int
    attempt: int  # 0, then 1, 2... after restarts (max_restarts)
    time: float  # when it raised (time.time()): the root cause is the earliest
    type_name: str
    message: str
    traceback: str
    exception: bytes | None = field(default=None, repr=False)  # cloudpickled; None when it would not pickle
    host: str = ""
    pid: int = 0

    @classmethod
    def capture(cls, exc: BaseException, rank: int, attempt: int) -> RankExceptionRecord:
        """Record `exc`, raised by the function on `rank`; never raises itself."""
        try:
            pickled: bytes | None = cloudpickle.dumps(exc)
        except Exception:  # an exception holding something unpicklable: keep its text only
            pickled = None
        return cls(
            rank=rank, attempt=attempt, time=time.time(), type_name=type(exc).__qualname__,
            message=str(exc), traceback="".join(traceback.format_exception(exc)),
            exception=pickled, host=socket.gethostname(), pid=os.getpid(),
        )

    def to_bytes(self) -> bytes:
        return pickle.dumps(self)

    @classmethod
    def from_bytes(cls, data: bytes) -> RankExceptionRecord | None:
        """The record, or None for a file that is not one (half written, another version's)."""
        try:
            record = pickle.loads(data)
        except Exception:
            return None
        return record if isinstance(record, cls) else None

    def original(self) -> BaseException | None:
        """The rank's exception object, or None where it did not travel (unpicklable either way)."""
        if self.exception is None:
            return None
        try:
            exc = cloudpickle.loads(self.exception)
        except Exception:
            return None
        return exc if isinstance(exc, BaseException) else None


@dataclass(frozen=True)
class RankExitStatus:
    """A rank that ended the job without a recorded exception: what the launcher knows of it."""

    rank: int | None
    exitcode: int | None = None
    signal_name: str | None = None  # "SIGKILL" for exitcode -9
    detail: str | None = None  # what Ray Train said of that worker (its error's first line)


def root_cause(failures: Iterable[RankExceptionRecord]) -> RankExceptionRecord | None:
    """The failure that ended the job: of the last attempt, the earliest that is not a KeyboardInterrupt.

    After elastic restarts, what ended the job is the last attempt's failure. Ranks that failed because
    a peer died (broken collectives, the launcher's SIGINT) raise later than the peer did, so the
    earliest exception is the cause; KeyboardInterrupts count only when nothing else was raised.
    """
    failures = list(failures)
    if not failures:
        return None
    last = max(f.attempt for f in failures)
    attempt = [f for f in failures if f.attempt == last]
    real = [f for f in attempt if f.type_name != "KeyboardInterrupt"] or attempt
    return min(real, key=lambda f: (f.time, f.rank))


class _Rebuilt:
    """Mixed into a rank's exception class: the launcher's message as str(), pickled by rebuilding."""

    _failure: RankExceptionRecord
    _rank_message: str

    def __str__(self) -> str:
        return self._rank_message

    def __reduce__(self) -> tuple[Any, ...]:
        return rebuild_exception, (self._failure, self.world_size)  # type: ignore[attr-defined]


# Fields that live in the C structs of built-in exceptions (OSError.errno, SystemExit.code...): copied as
# attributes, since the rebuilt instance is made without running the original's __init__.
_SKIPPED_FIELDS = {"args", "__traceback__", "__context__", "__cause__", "__suppress_context__", "__dict__",
                   "__notes__", "__weakref__"}


def _builtin_fields(cls: type) -> list[str]:
    names = []
    for klass in cls.__mro__:
        if klass.__module__ != "builtins" or not issubclass(klass, BaseException):
            continue
        for name, value in vars(klass).items():
            descriptor = isinstance(value, (types.MemberDescriptorType, types.GetSetDescriptorType))
            if descriptor and name not in _SKIPPED_FIELDS and name not in names:
                names.append(name)
    return names


def _as_instance_of(original: BaseException) -> BaseException:
    """An instance of a class derived from the original's (and from RankError when it is an Exception)."""
    cause = type(original)
    if issubclass(cause, _Rebuilt):  # a nested launch's rebuilt exception: its class already fits
        cls = cause
    else:
        mixins: tuple[type, ...] = (_Rebuilt,)
        if issubclass(cause, Exception) and not issubclass(cause, RankError):
            mixins += (RankError,)  # KeyboardInterrupt and SystemExit stay outside `except Exception`
        # Named as the original, so a notebook's error shows "ValueError", not a wrapper's name.
        cls = type(cause.__name__, (*mixins, cause), {"__module__": cause.__module__,
                                                      "__qualname__": cause.__qualname__})
    exc = cls.__new__(cls, *original.args)
    exc.__dict__.update(original.__dict__)
    exc.args = original.args
    for name in _builtin_fields(cause):
        try:
            setattr(exc, name, getattr(original, name))
        except (AttributeError, TypeError):
            pass
    if getattr(original, "__notes__", None) is not None:
        exc.__notes__ = list(original.__notes__)
    return exc


def rebuild_exception(failure: RankExceptionRecord, world_size: int) -> BaseException:
    """The rank's exception, to raise in the caller: its own type and attributes, plus `rank`.

    The message names the rank and carries the remote traceback; a note says where it ran. An exception
    that did not travel becomes a RankFailedError with the same message. A class that cannot be derived
    from (a metaclass or constructor that refuses it) gives the original object itself, with the
    message added as a note: its type is kept, though it is then no RankError.
    """
    header = f"rank {failure.rank} of {world_size} raised {failure.type_name}: {failure.message}"
    message = f"{header}\n\n--- remote traceback (rank {failure.rank}) ---\n{failure.traceback.rstrip()}"
    where = f"raised on rank {failure.rank} of {world_size}"
    if failure.host:
        where += f" (host {failure.host}, pid {failure.pid}, attempt {failure.attempt})"
    original = failure.original()
    if original is None:
        exc: BaseException = RankFailedError(message, rank=failure.rank, world_size=world_size)
    else:
        try:
            exc = _as_instance_of(original)
            exc._failure = failure  # type: ignore[attr-defined]
            exc._rank_message = message  # type: ignore[attr-defined]
        except Exception:
            exc = original
            exc.add_note(message)
    exc.rank = failure.rank  # type: ignore[attr-defined]
    exc.world_size = world_size  # type: ignore[attr-defined]
    exc.remote_traceback = failure.traceback  # type: ignore[attr-defined]
    exc.add_note(where)
    return exc


def rank_died(exit: RankExitStatus, world_size: int, logs: str) -> RankFailedError:
    """The error for a rank that died without raising; `logs` says where its output is."""
    if exit.signal_name:
        what = f"was killed by signal {exit.signal_name} (exit code {exit.exitcode})"
    elif exit.detail:
        what = f"died without raising a Python exception ({exit.detail})"
    else:
        what = f"exited with code {exit.exitcode} without raising a Python exception"
    return RankFailedError(
        f"rank {exit.rank} of {world_size} {what}. If it ran out of memory, lower the batch size or the "
        f"number of processes; {logs}.", rank=exit.rank, exitcode=exit.exitcode, world_size=world_size,
    )


def job_failure(failures: Iterable[RankExceptionRecord], world_size: int, exit: RankExitStatus,
                logs: str) -> BaseException:
    """What a failed launch raises: the root cause's exception, else the error of the rank that died."""
    cause = root_cause(failures)
    if cause is not None:
        return rebuild_exception(cause, world_size)
    return rank_died(exit, world_size, logs)
