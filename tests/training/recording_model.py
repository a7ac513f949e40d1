"""A user model for launch tests, named by import path in a job's config
(`model.class_path: "tests.training.recording_model:RecordingClassifier"`).

The built-in feature classifier, plus: after every training step it appends a line
"<run id> <global step before the step> <sample ids>" to
`<options.record_dir>/ids-rank<r>.txt` (flushed at once, so a SIGKILL loses nothing
written), writes its process id to `pid-rank<r>` when training starts, and sleeps
`options.step_sleep_s` so that a test can act mid-epoch. With `options.record_weights`,
every validation's end (the sanity check aside) saves the network's weights as
`weights-rank<r>-epoch<e>.pt` there: what a rank held when that epoch was judged.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from training.models.classifier import FeatureClassifier


class RecordingClassifier(FeatureClassifier):
    """FeatureClassifier that records the ids of every step's batch (see the module)."""

    def __init__(self, num_features: int, classes: list[Any], model: dict[str, Any]) -> None:
        super().__init__(num_features, classes, model)
        self.record_dir = Path(model["options"]["record_dir"])
        self.step_sleep_s = float(model["options"].get("step_sleep_s", 0.0))
        self.record_weights = bool(model["options"].get("record_weights", False))

    def on_train_start(self) -> None:
        (self.record_dir / f"pid-rank{self.global_rank}").write_text(str(os.getpid()))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        ids = " ".join(str(i) for i in batch["id"].tolist())
        with open(self.record_dir / f"ids-rank{self.global_rank}.txt", "a") as handle:
            handle.write(f"{run_id} {self.global_step} {ids}\n")
        time.sleep(self.step_sleep_s)
        return loss

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if not self.record_weights or self.trainer.sanity_checking:
            return
        name = f"weights-rank{self.global_rank}-epoch{self.current_epoch}.pt"
        torch.save(
            {k: v.detach().cpu() for k, v in self.net.state_dict().items()}, self.record_dir / name
        )
