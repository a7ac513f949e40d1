"""Flow parameters: pydantic models, so the Prefect UI renders forms and rejects bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from flows.cluster import DaskConfig
from preprocessing.config import ReshardConfig
from training.config import TrainConfig

PRESETS_DIR = Path(__file__).parent / "presets"
WORK_DIR_PLACEHOLDER = "${WORK_DIR}"


class PipelineParams(BaseModel):
    """reshard -> train -> track, as one flow run."""

    model_config = ConfigDict(extra="forbid")

    reshard: ReshardConfig
    dask: DaskConfig = Field(default_factory=DaskConfig, description="Where Dask runs.")
    train: TrainConfig = Field(
        description="Training job; its `dataset` is replaced by the version the reshard made."
    )
    num_processes: int = Field(2, gt=0, description="Training processes (torchrun, one node).")
    train_timeout_s: int = Field(1800, gt=0, description="Fail the training job after this.")


def load_preset(name_or_path: str, work_dir: str | Path | None = None) -> dict[str, Any]:
    """A shipped preset by name (`demo`) or a YAML file, with `${WORK_DIR}` filled in."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESETS_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        shipped = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"config {name_or_path}: no such file or preset {shipped}")
    text = path.read_text()
    if work_dir is not None:
        text = text.replace(WORK_DIR_PLACEHOLDER, str(Path(work_dir).resolve()))
    return dict(yaml.safe_load(text) or {})
