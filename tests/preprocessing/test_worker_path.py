"""Dask workers start with the driver's sys.path: a logged model's `code/` folder (a
partial copy of ballast's packages that MLflow puts first when it loads the model) is left
out while ballast starts them, so the workers import the real packages."""

from __future__ import annotations

import sys
from pathlib import Path

from preprocessing.driver.cluster import own_packages_only

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
