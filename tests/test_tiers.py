"""The tier checks of tests/tiers.py can fail: the quick tier's guard trips on a process start
or a service fixture, and the 60-second rule reports (or, enforced, fails) a slow test."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import tiers

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


def test_a_quick_test_with_a_service_or_a_process_start_is_a_violation() -> None:
    """Invariant: a service fixture anywhere in a quick test's closure, or one process start,
    is a violation naming it; a slow test has none, whatever it does."""
    problems = tiers.tier_violations(False, ["tmp_path", "mlflow_uri"], ["os.fork: ()"])
    assert problems == ["uses the service fixture 'mlflow_uri'", "started a process: os.fork: ()"]
    assert tiers.tier_violations(True, ["dask_client"], ["os.fork: ()"]) == []
    assert tiers.tier_violations(False, ["tmp_path"], []) == []


def test_the_recorder_keeps_process_starts_only_while_watching() -> None:
    """Invariant: the recorder keeps process events while watching, with what was started,
    and nothing else: not other audit events, nothing once it stopped."""
    recorder = tiers.ProcessRecorder()
    recorder.audit("subprocess.Popen", ("git", ["git", "status"], None, None))
    recorder.begin()
    recorder.audit("open", ("/etc/hosts", "r", 0))
    recorder.audit("subprocess.Popen", ("git", ["git", "status"], None, None))
    recorder.audit(tiers.MULTIPROCESSING_START, ("SpawnProcess-1",))
    starts = recorder.end()
    recorder.audit("os.fork", ())
    assert len(starts) == 2 and starts[0].startswith("subprocess.Popen: git status (thread")
    assert starts[1].startswith(tiers.MULTIPROCESSING_START + ": SpawnProcess-1 (thread")


def test_only_unlisted_tests_over_the_limit_are_reported() -> None:
    """Invariant: a test over 60 s is reported unless listed (a listed test covers all its
    parametrisations); one under the limit never is."""
    durations = {"a.py::test_e2e[x]": 90.0, "a.py::test_slow": 61.0, "a.py::test_ok": 59.0}
    assert tiers.over_limit(durations, {"a.py::test_e2e"}) == {"a.py::test_slow": 61.0}


def test_a_listed_test_stays_allowed_under_an_xdist_group() -> None:
    """Invariant: under `--dist loadgroup` xdist appends `@group` to a grouped test's node
    id; a listed test is still allowed (with or without parameters) and an unlisted one
    still reported, under its id as xdist reports it."""
    durations = {
        "a.py::test_e2e@pipeline-run": 90.0,
        "a.py::test_p[x]@a.py": 90.0,
        "a.py::test_slow@slurm": 61.0,
        "a.py::test_q[ada@corp]": 61.0,  # an "@" in parameters is no group suffix
    }
    allowed = {"a.py::test_e2e", "a.py::test_p", "a.py::test_q[ada"}  # what a cut would leave
    assert tiers.over_limit(durations, allowed) == {
        "a.py::test_slow@slurm": 61.0,
        "a.py::test_q[ada@corp]": 61.0,
    }


def test_the_limit_stretches_with_the_load_of_the_machine() -> None:
    """Invariant: at load 1 (or below) the limit is 60 s; on a machine loaded 2x over its
    cores a test has twice as long."""
    durations = {"a.py::test_a": 70.0, "a.py::test_b": 130.0}
    assert tiers.over_limit(durations, (), {"a.py::test_a": 0.5, "a.py::test_b": 0.5}) == durations
    assert tiers.over_limit(durations, (), {"a.py::test_a": 2.0, "a.py::test_b": 2.0}) == {
        "a.py::test_b": 130.0
    }


@pytest.mark.parametrize(
    ("enforce", "status"), [("1", pytest.ExitCode.TESTS_FAILED), ("", pytest.ExitCode.OK)]
)
def test_a_slow_unlisted_test_fails_the_run_only_when_enforced(
    monkeypatch: pytest.MonkeyPatch, enforce: str, status: pytest.ExitCode
) -> None:
    """Invariant: with BALLAST_ENFORCE_DURATIONS=1 an unlisted test over the limit (its
    phases summed) turns a green session red; without it the status is left as it was."""
    monkeypatch.setenv(tiers.ENFORCE_VARIABLE, enforce)
    checks = tiers.TierChecks(end_to_end={"a.py::test_e2e"})
    for nodeid, seconds in [
        ("a.py::test_b", 30.0),
        ("a.py::test_b", 40.0),
        ("a.py::test_b", 0.5),
        ("a.py::test_e2e", 300.0),
    ]:
        report = SimpleNamespace(nodeid=nodeid, duration=seconds)
        checks.pytest_runtest_logreport(report)  # type: ignore[arg-type]
    checks.slowdowns = {"a.py::test_b": 1.0, "a.py::test_e2e": 1.0}  # a quiet machine
    session = SimpleNamespace(exitstatus=pytest.ExitCode.OK)
    checks.pytest_sessionfinish(session)  # type: ignore[arg-type]
    assert checks.over == checks.failing == {"a.py::test_b": 70.5}
    assert session.exitstatus == status


INNER_CONFTEST = """
import pytest
from tests.tiers import TierChecks

def pytest_configure(config):
    config.pluginmanager.register(TierChecks(()), "ballast-tiers")

@pytest.fixture(scope="session")
def dask_client():
    raise AssertionError("the guard lets a quick test start a service")
"""
INNER_TESTS = """
import multiprocessing, subprocess, sys
import pytest

def test_quick_runs_a_subprocess():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_quick_spawns_a_process():
    process = multiprocessing.get_context("spawn").Process(target=print)
    process.start()
    process.join()

def test_quick_asks_for_a_cluster(dask_client):
    pass

def test_quick_pure():
    assert sum(range(4)) == 6

@pytest.mark.slow
def test_slow_runs_a_subprocess():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


@pytest.mark.slow
def test_the_guard_fails_quick_tests_that_start_processes_or_services(
    pytester: pytest.Pytester,
) -> None:
    """Invariant: in a real pytest run a quick test that runs a subprocess, spawns a
    multiprocessing process or asks for a service fixture fails (the fixture never runs),
    while a pure quick test and a slow test that starts a subprocess pass."""
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=INNER_TESTS)
    pytester.makeini("[pytest]\nmarkers = slow: slow\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), *sys.path]))
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=2, failed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_quick_asks_for_a_cluster is in the quick tier but uses the service fixture "
            "'dask_client'*",
            "*test_quick_runs_a_subprocess is in the quick tier but started a process: "
            "subprocess.Popen*",
            "*test_quick_spawns_a_process is in the quick tier but started a process: "
            "ballast.multiprocessing.start*",
        ]
    )
    assert "the guard lets a quick test start a service" not in result.stdout.str()


def test_every_listed_end_to_end_test_exists() -> None:
    """Invariant: each END_TO_END entry names a test function of an existing file (a renamed
    test drops out of the list loudly, not silently)."""
    import ast

    from tests.conftest import END_TO_END

    for nodeid in END_TO_END:
        path, name = nodeid.split("[")[0].split("::")
        tree = ast.parse((ROOT / path).read_text())
        assert name in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}, (
            nodeid
        )
