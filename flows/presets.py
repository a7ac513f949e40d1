"""The shipped presets (`flows/presets/*.yaml`) and reading a config by preset name or
file, without importing Prefect, MLflow or torch: `ballast run` reads its config and
checks every S3 URI in it (preprocessing/storage/reach.py) before it imports them, so a
dead endpoint or a missing bucket is named in seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flows.overrides import WORK_DIR_PLACEHOLDER
from preprocessing.toolbox.config_files import read_config_file

PRESETS_DIR = Path(__file__).parent / "presets"


def preset_location(name_or_path: str) -> str:
    """The file of a shipped preset named `name_or_path` (`demo`), else `name_or_path`
    itself: a YAML file's path or fsspec URI."""
    if "://" in name_or_path:
        return name_or_path
    path = Path(name_or_path) if Path(name_or_path).suffix else PRESETS_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        shipped = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"config {name_or_path}: no such file or preset {shipped}")
    return str(path)


def load_preset(name_or_path: str, work_dir: str | Path | None = None) -> dict[str, Any]:
    """A shipped preset by name (`demo`) or a YAML file (path or fsspec URI), with
    `${WORK_DIR}` filled in; validate it with `flows.params.parse_params`."""
    filled = {} if work_dir is None else {WORK_DIR_PLACEHOLDER: str(Path(work_dir).resolve())}
    return read_config_file(preset_location(name_or_path), filled)
