"""Dask workers start with the driver's sys.path: a logged model's `code/` folder (a
partial copy of ballast's packages that MLflow puts first when it loads the model) is left
out while ballast starts them, so the workers import the real packages; and they do not
run the driver's main script (preprocessing/driver/worker_start.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from preprocessing.driver.worker_start import own_packages_only

REPO = Path(__file__).resolve().parents[2]


def test_a_model_code_folder_is_left_out_while_workers_start(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "preprocessing" / "contract").mkdir(parents=True)
    (code / "preprocessing" / "__init__.py").write_text("")
    sys.path.insert(0, str(code))
    try:
        with own_packages_only():
            assert str(code) not in sys.path
            assert str(REPO) in sys.path or "" in sys.path  # the real packages stay
        assert sys.path[0] == str(code)  # the driver's own path is left as it was
    finally:
        sys.path.remove(str(code))


# A driver script that records every process running its module-level code.
DRIVER = """
import os, sys
sys.path.insert(0, {repo!r})
with open({marks!r}, "a") as marks:
    marks.write(f"{{os.getpid()}} {{__name__}}\\n")

def main():
    from distributed import Client
    from preprocessing.driver.cluster import local_cluster

    with local_cluster(2) as cluster, Client(cluster) as client:
        assert client.submit(sum, [1, 2]).result() == 3

if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
def test_workers_of_a_driver_script_do_not_run_its_module_code(tmp_path: Path) -> None:
    """Invariant: the worker processes of a local cluster started from a script do not run
    the script's module-level code (multiprocessing's spawn would, as `__mp_main__`, and a
    script importing torch made every worker import it): only the driver's own process
    left a mark, and the cluster ran a task."""
    marks, script = tmp_path / "marks", tmp_path / "driver.py"
    script.write_text(DRIVER.format(repo=str(REPO), marks=str(marks)))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = marks.read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith(" __main__"), lines
