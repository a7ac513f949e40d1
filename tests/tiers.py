"""The two tiers of the suite and the checks that keep them true (hooks in tests/conftest.py).

The quick tier (`pytest -m "not slow"`, `make test-quick`) is every test not marked
`slow`; it must start no process and no service. A quick-tier test fails when, between the
start of its setup and the end of its call, this process started a process (an audit
event: subprocess.Popen, os.fork, os.posix_spawn, os.system, os.exec*, a multiprocessing
start), or when it asks, directly or through another fixture, for a service fixture
(a Dask cluster, moto, MLflow, Prefect). Nothing is patched but
`multiprocessing.process.BaseProcess.start`, which gains an audit event because the
spawn and forkserver starts raise none of their own.

Every run also reports each test whose setup + call + teardown took over 60 s and that is
not in `END_TO_END` (tests/conftest.py). With BALLAST_ENFORCE_DURATIONS=1 (.ci/run) such a
test fails the session when it took over 60 s times the machine's load (the 1-minute load
average over the cores, at least 1): on a quiet machine the limit is 60 s, while a machine
loaded several-fold, which stretches every wall time as much, does not turn the suite red.
"""

from __future__ import annotations

import multiprocessing.process
import os
import sys
import threading
from collections.abc import Generator, Iterable
from typing import Any

import pytest

from tests.parallel import plain_nodeid

# Session or module fixtures that start a service; a test needing one is slow by definition.
SERVICE_FIXTURES = frozenset(
    {"dask_client", "s3_endpoint", "mlflow_uri", "proxy", "prefect_harness", "slurm_cluster"}
)
MULTIPROCESSING_START = "ballast.multiprocessing.start"
PROCESS_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.exec",
        MULTIPROCESSING_START,
    }
)
LIMIT_S = 60.0
ENFORCE_VARIABLE = "BALLAST_ENFORCE_DURATIONS"


class ProcessRecorder:
    """Collects the process starts this process makes while `watching` (any thread)."""

    def __init__(self) -> None:
        self.watching = False
        self.starts: list[str] = []

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.watching and event in PROCESS_EVENTS:
            self.starts.append(describe_start(event, args))

    def begin(self) -> None:
        self.starts = []
        self.watching = True

    def end(self) -> list[str]:
        self.watching = False
        return self.starts


def describe_start(event: str, args: tuple[Any, ...]) -> str:
    """`event: what` in a few words, with the thread, so a report says what started where."""
    what = args[1] if event == "subprocess.Popen" and len(args) > 1 else args[:1]
    if isinstance(what, list | tuple):
        what = " ".join(str(part) for part in what)
    return f"{event}: {str(what)[:120]} (thread {threading.current_thread().name})"


def tier_violations(
    slow: bool, fixturenames: Iterable[str], starts: list[str], starting: Iterable[str] = ()
) -> list[str]:
    """Why a test does not belong in the quick tier; empty when it does (or is slow).
    `starting`: fixtures seen starting a process, beyond the SERVICE_FIXTURES."""
    if slow:
        return []
    names = set(fixturenames)
    problems = [f"uses the service fixture {name!r}" for name in sorted(SERVICE_FIXTURES & names)]
    problems += [
        f"uses the fixture {name!r}, which starts a process"
        for name in sorted((set(starting) - SERVICE_FIXTURES) & names)
    ]
    return problems + [f"started a process: {start}" for start in starts]


def violation_message(nodeid: str, problems: list[str]) -> str:
    return (
        f"{nodeid} is in the quick tier but {'; '.join(problems)}. A test that starts a "
        "subprocess, torchrun, a Dask cluster or a server is marked @pytest.mark.slow "
        "(tests/tiers.py)."
    )


def over_limit(
    durations: dict[str, float], allowed: Iterable[str], slowdowns: dict[str, float] | None = None
) -> dict[str, float]:
    """Tests over LIMIT_S (stretched by their slowdown, when given), less those allowed by
    node id or by the node id without parameters (a listed test covers them all)."""
    allowed, slowdowns = set(allowed), slowdowns or {}
    return {
        nodeid: seconds
        for nodeid, seconds in durations.items()
        if seconds > LIMIT_S * max(1.0, slowdowns.get(nodeid, 1.0))
        and plain_nodeid(nodeid).split("[")[0] not in allowed
        and plain_nodeid(nodeid) not in allowed
    }


def slowdown() -> float:
    """How many times over its cores this machine is loaded (1-minute load average)."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)


RECORDER = ProcessRecorder()
_start = multiprocessing.process.BaseProcess.start


def _audited_start(self: multiprocessing.process.BaseProcess) -> None:
    sys.audit(MULTIPROCESSING_START, self.name)
    _start(self)


def install() -> None:
    """Once per interpreter: audit hooks cannot be removed, so the recorder gates itself."""
    if multiprocessing.process.BaseProcess.start is not _audited_start:
        multiprocessing.process.BaseProcess.start = _audited_start  # type: ignore[method-assign]
        sys.addaudithook(RECORDER.audit)


def is_slow(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None


class TierChecks:
    """The pytest plugin: the quick tier's guard and the 60-second report."""

    def __init__(self, end_to_end: Iterable[str]) -> None:
        self.end_to_end = frozenset(end_to_end)
        self.durations: dict[str, float] = {}
        self.slowdowns: dict[str, float] = {}
        self.starting: set[str] = set()
        self.over: dict[str, float] = {}
        self.failing: dict[str, float] = {}
        install()

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any]) -> Generator[None, Any, Any]:
        """Learn which fixtures start a process, so that every quick test that uses one
        fails, not only the first (a module or session fixture starts once)."""
        before = len(RECORDER.starts)
        try:
            return (yield)
        finally:
            if len(RECORDER.starts) > before:
                self.starting.add(fixturedef.argname)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        """A quick-tier test that asks for a service fails before the service starts."""
        problems = tier_violations(is_slow(item), item.fixturenames, [], self.starting)
        if problems:
            pytest.fail(violation_message(item.nodeid, problems), pytrace=False)
        RECORDER.begin()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        """A quick-tier test that started a process (in its setup or its body) fails."""
        try:
            return (yield)
        finally:
            problems = tier_violations(is_slow(item), [], RECORDER.end())
            if problems:
                pytest.fail(violation_message(item.nodeid, problems), pytrace=False)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration
        self.slowdowns[report.nodeid] = max(self.slowdowns.get(report.nodeid, 0.0), slowdown())

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.over = over_limit(self.durations, self.end_to_end)
        self.failing = over_limit(self.durations, self.end_to_end, self.slowdowns)
        if self.failing and enforced() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.over:
            return
        terminalreporter.section(f"over {LIMIT_S:.0f} s, not in END_TO_END (tests/conftest.py)")
        for nodeid, seconds in sorted(self.over.items(), key=lambda entry: -entry[1]):
            terminalreporter.line(
                f"{seconds:7.1f} s  {nodeid}  (machine load "
                f"{self.slowdowns[nodeid]:.1f}x its cores)"
                + ("  FAILS" if enforced() and nodeid in self.failing else "")
            )
        terminalreporter.line(
            f"{ENFORCE_VARIABLE}=1 fails the run on those over {LIMIT_S:.0f} s x the load"
            if enforced()
            else f"report only; {ENFORCE_VARIABLE}=1 (.ci/run) fails the run "
            f"on those over {LIMIT_S:.0f} s x the load"
        )


def enforced() -> bool:
    return os.environ.get(ENFORCE_VARIABLE) == "1"
