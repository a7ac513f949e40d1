"""The allocator settings every Dask worker of a reshard should start with (M21), and the
warning naming the workers that lack them.

The clusters ballast starts put `WORKER_MALLOC_ENV` in each worker's environment before
the process starts (preprocessing/driver/cluster.py, and the job scripts of
preprocessing/driver/jobqueue.py); workers started by someone else are checked and, when
they lack it, named in a `WorkerEnvironmentWarning` with the exact variables.
"""

from __future__ import annotations

import os
import warnings

from distributed import Client

# Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=64 KiB, which also turns off
# glibc's adaptive mmap threshold: every numpy or Python buffer over 128 KiB is then mapped
# fresh and unmapped on free, so each temporary of the exchange page-faults anew (2.0 M
# faults and ~40% of the reshard's CPU time in the kernel, measured on 1 GB; M21). Arrays up
# to 64 MiB come from the heap instead; up to 256 MiB of free heap is kept for reuse.
# glibc reads them once at process start: they must be in a worker's environment before it
# starts (a nanny keeps values it finds in its own environment over its defaults).
WORKER_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": 64 << 20, "MALLOC_TRIM_THRESHOLD_": 256 << 20}


class WorkerEnvironmentWarning(RuntimeWarning):
    """Dask workers run without ballast's allocator settings (slower, same output)."""


def warn_missing_allocator_settings(client: Client) -> None:
    """A `WorkerEnvironmentWarning` naming the workers and the exact variables, when any
    worker's environment lacks `WORKER_MALLOC_ENV` (a cluster ballast did not start)."""
    wanted = {name: str(value) for name, value in WORKER_MALLOC_ENV.items()}
    found = client.run(_allocator_environ)
    # Threads in the driver's own process (`dask.kind: threads`) share its allocator, set
    # or not when it started: nothing a worker's environment could change.
    lacking = sorted(a for a, env in found.items() if env != wanted and not a.startswith("inproc"))
    if lacking:
        settings = " ".join(f"{name}={value}" for name, value in wanted.items())
        warnings.warn(
            f"{len(lacking)} of {len(found)} Dask workers ({', '.join(lacking)}) run without "
            f"ballast's allocator settings; set {settings} in the workers' environment before "
            "they start (docs/architecture.md M21): the output is the same, the exchange slower",
            WorkerEnvironmentWarning,
            stacklevel=3,
        )


def _allocator_environ() -> dict[str, str | None]:
    """On a worker: its values of the allocator variables."""
    return {name: os.environ.get(name) for name in WORKER_MALLOC_ENV}
