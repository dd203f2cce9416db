"""A verbose launch (`verbose=True`, or GALLERY_VERBOSE=1 for every launch) tells what the launcher decided:
the plan, the threads per rank, the rendezvous port, a restart. Otherwise none of it appears, even where the
application logs at INFO."""

from __future__ import annotations

import logging
import os

import pytest

from helpers import distributed


@distributed(processes=2, device="cpu", max_restarts=1)
def restarts_once():
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0 and os.environ["RANK"] == "1":
        raise RuntimeError("the first attempt fails")
    return attempt


DECISIONS = ("[launcher] plan: 2 processes, device cpu, torch backend gloo",
             "[launcher] threads per process: ", "[launcher] rendezvous: 127.0.0.1:",
             "[rank0] [launcher] restart: attempt 1 of the group starts")


class _Collected(logging.Handler):
    """What an application's own logging configuration (`basicConfig(level=INFO)`) would receive."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.names.append(record.name)


@pytest.fixture
def application_logs_at_info():
    root, handler = logging.getLogger(), _Collected()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


@pytest.mark.parametrize("how", ["option", "environment", "neither"])
def test_the_launchers_decisions_show_only_when_verbose(how, monkeypatch, capsys, application_logs_at_info):
    monkeypatch.delenv("GALLERY_VERBOSE", raising=False)
    monkeypatch.delenv("HELPERS_VERBOSE", raising=False)
    if how == "environment":
        monkeypatch.setenv("GALLERY_VERBOSE", "1")
    fn = restarts_once.options(verbose=True) if how == "option" else restarts_once
    assert fn.distributed() == [1, 1]
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert not [name for name in application_logs_at_info.names if name.startswith("helpers")]
    if how == "neither":
        assert "[launcher]" not in output, output
    else:
        missing = [line for line in DECISIONS if line not in output]
        assert not missing, output
