"""Imported first by the launcher's forkserver, and by nothing else: the server's own output goes to a file.

The forkserver inherits the kernel's stdout and stderr, and Jupyter shows whatever reaches them in the cell
that runs at that moment. What a module the server pre-loads prints as it is imported (Unsloth's banner,
say) would land in some later cell of the notebook, a different one from run to run, and nbval would compare
it. The ranks are not concerned: torch elastic gives each its own files, which the launcher shows prefixed
with the rank. The server writes to `<tempdir>/helpers-forkserver-<its pid>.log` instead, removed at its
exit when nothing was written.
"""

from __future__ import annotations

import atexit
import os
import sys
import tempfile

from helpers.launch import _compat


def log_path(pid: int | None = None) -> str:
    return os.path.join(tempfile.gettempdir(), f"helpers-forkserver-{pid or os.getpid()}.log")


if _compat.in_forkserver_preload():
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    _fd = os.open(log_path(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(_fd, 1)
    os.dup2(_fd, 2)
    os.close(_fd)

    def _remove_if_empty(path: str = log_path()) -> None:
        try:
            if os.path.getsize(path) == 0:
                os.unlink(path)
        except OSError:
            pass

    atexit.register(_remove_if_empty)   # the server exits with its kernel: an empty log is not kept
