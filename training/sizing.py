"""Training settings sized to a table, for the config `ballast init` proposes.

A fixed number of epochs under-trains a small table (400 rows at 64 a batch: 4 epochs
are 28 optimizer steps) and wastes hours on a large one. So the step budget is fixed
instead: about `TARGET_STEPS` optimizer steps, as epochs over the training rows, within
[MIN_EPOCHS, MAX_EPOCHS]; the batch and the network widen with the rows (a larger
batch keeps an epoch's steps, and so its time, in bounds; a wider network has the data to
fit it). The model is the built-in `tabular` one (training/models/tabular.py), its
settings written out in full so that a user sees what to change.
"""

from __future__ import annotations

import math
from typing import Any

from training.models.config import TabularConfig

TARGET_STEPS = 1_500
MIN_EPOCHS, MAX_EPOCHS = 4, 40
# (rows below, batch size, hidden width); the last row holds for any size above.
SIZES = ((20_000, 64, 64), (500_000, 256, 128), (math.inf, 1024, 256))
LEARNING_RATE = 3e-3
MODEL = "tabular"


def sized_training(num_training_rows: int) -> dict[str, Any]:
    """`max_epochs`, the loader's batch size, and the model, its widths, learning rate
    and settings, for a training split of `num_training_rows` rows (TrainConfig fields)."""
    rows = max(num_training_rows, 1)
    batch, width = next((batch, width) for limit, batch, width in SIZES if rows < limit)
    epochs = math.ceil(TARGET_STEPS * batch / rows)
    return {
        "max_epochs": min(max(epochs, MIN_EPOCHS), MAX_EPOCHS),
        "loader": {"batch_size": batch},
        "model": {
            "class_path": MODEL,
            "hidden_sizes": [width, width],
            "learning_rate": LEARNING_RATE,
            "tabular": TabularConfig().model_dump(),
        },
    }
