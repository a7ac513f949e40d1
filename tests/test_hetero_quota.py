"""benchmarks/hetero_quota.py, the slow-down behind `hetero_bench --slow-by quota`: a process
added to the group takes its children with it, the group holds them to half a core, and
closing it leaves no group behind. Needs root and a cgroup cpu controller (skipped, with
the reason, where the host offers neither)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import pytest

from benchmarks.hetero_quota import CpuQuota, descendants

pytestmark = pytest.mark.slow  # starts a busy process tree

BUSY_CHILD = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'while True: pass'])"


def cpu_s(pid: int) -> float:
    """The process's CPU seconds (user + system) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def until(what: str, done: Callable[[], object], deadline_s: float = 60.0) -> None:
    """Poll `done()` until it is true; fail naming `what` after `deadline_s`."""
    give_up = time.monotonic() + deadline_s
    while not done():
        assert time.monotonic() < give_up, f"gave up after {deadline_s} s waiting for {what}"
        time.sleep(0.05)


def throttled(quota: CpuQuota) -> int:
    stat = dict(line.split() for line in (quota.path / "cpu.stat").read_text().splitlines())
    return int(stat["nr_throttled"])


def test_a_quota_holds_a_process_tree_to_half_a_core_and_closes_clean() -> None:
    """Invariant: a busy loop started by a process added to the group (so only a child,
    moved with its parent) is in the group, needs at least 1.8 s of wall time for 1 CPU-s
    (half a core: 2 s) and is throttled by it; `close` leaves no group directory."""
    try:
        quota = CpuQuota(0.5)
    except SystemExit as why:
        pytest.skip(str(why))
    parent = subprocess.Popen([sys.executable, "-c", BUSY_CHILD])
    try:
        until("the busy child to start", lambda: descendants(parent.pid))
        child = descendants(parent.pid)[0]
        quota.add(parent.pid)
        assert str(child) in (quota.path / "cgroup.procs").read_text().split()
        used, start = cpu_s(child), time.monotonic()
        until("1 CPU-s of the busy child", lambda: cpu_s(child) - used >= 1.0)
        assert time.monotonic() - start >= 1.8
        assert throttled(quota) > 0
    finally:
        for pid in [*descendants(parent.pid), parent.pid]:
            with suppress(ProcessLookupError):  # exited meanwhile
                os.kill(pid, signal.SIGKILL)
        parent.wait(timeout=30)
        quota.close()
    assert not quota.path.exists()
