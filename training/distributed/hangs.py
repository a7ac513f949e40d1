"""Hang reports: the one line a rank's watchdog leaves when training stopped making progress.

A rank whose watchdog (training/distributed/watchdog.py) fires writes
`<output_dir>/errors/hang-rank-<r>.log`, one line naming the stuck ranks, and exits with
HANG_STATUS. The launcher reads and removes them after a failed attempt
(`take_hang_reports`), so the attempt fails with that line as its cause and is retried
like any transient failure (a hang is not a config error: the `rank-<r>.log` files of
training/launch/failures.py are never retried, these always may be).

Light at import (fsspec only): the launcher reads them without torch or Lightning.
"""

from __future__ import annotations

import os

from fsspec.core import url_to_fs

from training.distributed.env import errors_dir

HANG_STATUS = 3


def hang_log_uri(output_dir: str, rank: int) -> str:
    return f"{errors_dir(output_dir)}/hang-rank-{rank}.log"


def write_hang_report(output_dir: str, rank: int, line: str) -> None:
    """Leave `line` where the launcher looks after the attempt ends."""
    fs, path = url_to_fs(hang_log_uri(output_dir, rank))
    fs.makedirs(os.path.dirname(path), exist_ok=True)
    fs.pipe_file(path, f"{line}\n".encode())


def take_hang_reports(output_dir: str) -> list[str]:
    """The lines of the ranks that reported a hang, in rank order, removed as read (so a
    later attempt's failure is not blamed on this one); empty if none or unreadable."""
    try:
        fs, path = url_to_fs(errors_dir(output_dir))
        logs = sorted(
            fs.glob(f"{path}/hang-rank-*.log"),
            key=lambda name: int(name.rsplit("-", 1)[1].split(".")[0]),
        )
        lines = [fs.cat_file(log).decode(errors="replace").strip() for log in logs]
        for log in logs:
            fs.rm_file(log)
    except (OSError, ValueError):
        return []
    return lines
