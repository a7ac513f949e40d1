"""The faults a data night of the soak makes happen to a running `python -m preprocessing`
(tests/soak/chain.py): SIGKILL of the driver's session or of one Dask worker, 503s from the
fault proxy, the output tmpfs filled; each says whether it took effect.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import numpy as np
import psutil

from tests.soak.soak_state import Soak


def inject(soak: Soak, kind: str, process: subprocess.Popen, rng: np.random.Generator) -> bool:
    """Make fault `kind` happen to the running `process` now; whether it took effect."""
    if process.poll() is not None:
        return False
    return INJECT[kind](soak, process, rng)


def kill_driver(soak: Soak, process: subprocess.Popen, rng: np.random.Generator) -> bool:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
        return True
    return False


def kill_worker(soak: Soak, process: subprocess.Popen, rng: np.random.Generator) -> bool:
    """SIGKILL one of the driver's Dask worker processes (spawned by multiprocessing)."""
    with contextlib.suppress(psutil.Error):
        workers = [
            child
            for child in psutil.Process(process.pid).children(recursive=True)
            if "spawn_main" in " ".join(_cmdline(child))
        ]
        if workers:
            workers[int(rng.integers(len(workers)))].kill()
            return True
    return False


def answer_503(soak: Soak, process: subprocess.Popen, rng: np.random.Generator) -> bool:
    soak.proxy.inject(f"{soak.bucket}/raw/*", "503", times=int(rng.integers(2, 6)))
    return True


def fill_disk(soak: Soak, process: subprocess.Popen, rng: np.random.Generator) -> bool:
    """Fill the output tmpfs to within 0-32 KiB of full (the filler is removed after)."""
    stat = os.statvfs(soak.root)
    left = stat.f_bavail * stat.f_frsize - int(rng.integers(0, 32 << 10))
    with contextlib.suppress(OSError), open(soak.root / ".filler", "wb") as filler:
        while left > 0:  # in chunks: no buffer the size of the free space
            left -= filler.write(bytes(min(left, 1 << 20)))
    return True


INJECT = {
    "driver_kill": kill_driver,
    "worker_kill": kill_worker,
    "s3_503": answer_503,
    "disk_full": fill_disk,
}


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []
