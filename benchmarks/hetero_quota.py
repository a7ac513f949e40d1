"""A node at half speed for benchmarks/hetero_bench.py (`--slow-by quota`): its processes
in a Linux cgroup whose CPU quota is half of every 10 ms period, so that every cost of
the node, per row and per step alike, takes about twice as long, as on a core of half
the clock. A busy loop on the node's core mostly delays the rank's wake-ups (a cost per
step that no split of rows moves, RESULTS.md M48). Needs root and a cgroup `cpu`
controller (v2's `cpu.max` or v1's CFS quota files)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

PERIOD_US = 10_000
V2_ROOT, V1_ROOT = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu")


def cpu_root() -> Path:
    """The hierarchy whose `cpu` controller this host's cgroups offer; a clear error
    naming the flag when there is none or it cannot be written."""
    # v2: a child group has `cpu.max` only where its parent hands the controller down.
    delegated = V2_ROOT / "cgroup.subtree_control"
    if delegated.exists() and "cpu" in delegated.read_text().split():
        root = V2_ROOT
    elif (V1_ROOT / "cpu.cfs_quota_us").exists():
        root = V1_ROOT
    else:
        raise SystemExit("--slow-by quota: this host's cgroups offer no cpu controller")
    if not os.access(root, os.W_OK):
        raise SystemExit(f"--slow-by quota: {root} is not writable (run as root)")
    return root


class CpuQuota:
    """A cgroup at `fraction` of one core; `add` moves a process tree into it, `close`
    moves what is left back to the root and removes the group."""

    def __init__(self, fraction: float = 0.5) -> None:
        self.root = cpu_root()
        self.path = self.root / f"ballast-hetero-{uuid.uuid4().hex[:8]}"
        self.path.mkdir()
        quota = int(PERIOD_US * fraction)
        if self.root == V2_ROOT:
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))

    def add(self, pid: int) -> CpuQuota:
        """`pid` and every process under it (children started later inherit the group)."""
        for member in [pid, *descendants(pid)]:
            try:
                (self.path / "cgroup.procs").write_text(str(member))
            except OSError:  # exited meanwhile
                continue
        return self

    def close(self) -> None:
        for member in (self.path / "cgroup.procs").read_text().split():
            try:
                (self.root / "cgroup.procs").write_text(member)
            except OSError:
                continue
        self.path.rmdir()


def checked_slow_by(value: str) -> str:
    """`--slow-by`'s value, `quota` refused before any work where it cannot be applied."""
    if value == "quota":
        cpu_root()
    return value


def descendants(pid: int) -> list[int]:
    """Every process under `pid`, from /proc's children lists."""
    found, pending = [], [pid]
    while pending:
        tasks = Path(f"/proc/{pending.pop()}/task")
        for children in tasks.glob("*/children") if tasks.exists() else []:
            for child in children.read_text().split():
                found.append(int(child))
                pending.append(int(child))
    return found
