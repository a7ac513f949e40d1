"""What a worker process of a local Dask cluster starts from: the parent's import path
less partial copies of ballast's packages, and not its main script (multiprocessing's spawn
start runs the parent's main script in every child unless told otherwise)."""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def main_script_left_out() -> Iterator[None]:
    """Worker processes start without running this process's main script. A spawned
    process runs the parent's `__main__` file first (as `__mp_main__`), so a driver script
    that imports torch had every Dask worker import torch and Lightning too: each of
    loader_bench's three reshards paid it twice at start, and again in a close that Dask
    ended by killing the workers after 4 s (the whole benchmark at its smallest size: 77-94
    s and 64-74 CPU-s -> 39 s and 37 CPU-s). A main module whose spec is named `__main__`
    is one multiprocessing leaves out (as it does `python -m pkg`'s `pkg.__main__`);
    the workers run ballast's tasks, which never live in a driver's main script."""
    main = sys.modules["__main__"]
    saved = main.__dict__.get("__spec__")
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        yield
    finally:
        main.__spec__ = saved


@contextmanager
def own_packages_only() -> Iterator[None]:
    """Worker processes start with this process's `sys.path`. An entry holding a partial
    copy of ballast's packages (a logged model's `code/`, which MLflow puts first when the
    model is loaded in this process) would shadow the real packages in every worker, whose
    imports then fail (`No module named 'preprocessing.contract.slurm'`): such entries are
    left out while the workers start."""
    before = list(sys.path)
    sys.path[:] = [entry for entry in before if not _holds_partial_copy(entry)]
    try:
        yield
    finally:
        sys.path[:] = before


def _holds_partial_copy(entry: str) -> bool:
    package = Path(entry or ".") / "preprocessing"
    return (package / "__init__.py").is_file() and not (package / "driver").is_dir()
