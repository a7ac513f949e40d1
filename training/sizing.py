"""Training settings sized to a table, for the config `ballast init` proposes.

A fixed number of epochs under-trains a small table (400 rows at 64 a batch: 4 epochs
are 28 optimizer steps) and wastes hours on a large one. So the step budget is fixed
instead: about `TARGET_STEPS` optimizer steps, as epochs over the training rows, within
[MIN_EPOCHS, MAX_EPOCHS]. The batch grows with the rows (a larger batch keeps an epoch's
steps, and so its time, in bounds), as a ramp and not a step, so that the epochs fall
smoothly with the rows; the network widens with the rows (a wider network has the data
to fit it, and finer features: the periodic embeddings' initial frequencies are 10x
wider). Where the epochs' cap leaves a small table short of the budget, the learning
rate makes up the shortfall.
The model is the built-in `tabular` one (training/models/tabular.py), its settings
written out in full so that a user sees what to change, and its ensemble sized to the
rows too (`ensemble_size`). This is the one place these choices are made: a
config, once written, holds them as explicit settings and keeps its meaning.
"""

from __future__ import annotations

import math
from typing import Any

from training.models.config import TabularConfig

TARGET_STEPS = 1_500
MIN_EPOCHS, MAX_EPOCHS = 4, 40
# The batch: one row per EPOCH_STEPS training rows (an epoch of about 78 steps, so about 20
# epochs), within [MIN_BATCH, the size's batch]. It was the size's batch alone, 64 up to
# 20,000 rows and 256 from there, so the epochs jumped 4x at 20,000 rows (5 at 19,999, 20
# at 20,000, the same 1,500 steps); the ramp from 5,000 to 20,000 rows keeps them at 20.
# Up to 5,000 rows and from 20,000 the batch, and so the epochs, are what they were.
MIN_BATCH, EPOCH_STEPS = 64, 20_000 / 256
# (rows below, largest batch size, hidden width, the periodic embeddings' frequency
# scale); the last row holds for any size above. The scale is the spread of the
# embeddings' initial frequencies: at 0.1 (the model's default) a column's cos/sin span
# about one period over its clipped range, too coarse for a label set by narrow bands of
# a number (diamonds' cut by depth and table: 0.908x HGB; 0.982x at 1.0, the same epochs;
# benchmarks/RESULTS.md M79). Finer features need rows to be fitted and not memorised (at
# 1.0 three tables under 2,000 rows lost 5-9 points: M63), so they come with the rows.
SIZES = ((20_000, 256, 64, 0.1), (500_000, 256, 128, 1.0), (math.inf, 1024, 256, 1.0))
LEARNING_RATE = 3e-3
# The rate. Under about 2,400 training rows MAX_EPOCHS caps the run short of TARGET_STEPS
# (cars, 365 rows: 240 steps), and such runs were under-trained: 4x the epochs lifted cars
# from 0.970x to 1.004x HGB, at 4x the time (benchmarks/RESULTS.md M87). So the rate makes
# up the shortfall instead, LEARNING_RATE x TARGET_STEPS / steps, up to MAX_RATE_BOOST x:
# 2x raised or kept every such table of the suite (cars 0.970x -> 0.994x, biopsy 0.996x ->
# 1.003x; held out, Pima.te +4 points, participation -3), 1.5x left cars at 0.966x, 1e-3
# lost up to 11 points (M89). Where the budget is met the rate is LEARNING_RATE, as before;
# towards 2,400 rows the boost falls to 1 continuously.
MAX_RATE_BOOST = 2.0
MODEL = "tabular"
# Every TabM-mini member passes every row through the shared MLP, so an epoch costs
# members x rows of the first layer's work (8x the plain MLP's with 8 members; flights'
# 295,000 training rows took about 20 minutes an epoch on the loaded host that way, against
# HGB's 38 s fit: benchmarks/RESULTS.md M63, M73). The ensemble pays most where rows are
# few and one network's variance is high, so all MAX_MEMBERS train up to ENSEMBLE_ROWS
# training rows; above, the members halve each time the rows double (an epoch's
# member-rows stay within MAX_MEMBERS x ENSEMBLE_ROWS), down to one: a single MLP with its
# embeddings, as RealMLP trains.
MAX_MEMBERS, ENSEMBLE_ROWS = TabularConfig.model_fields["ensemble_size"].default, 50_000
ENSEMBLE_RULE = (
    f"init: {MAX_MEMBERS} up to {ENSEMBLE_ROWS:,} training rows, halved each time the "
    "rows double above, at least 1"
)
EPOCHS_RULE = (
    f"init: the epochs of about {TARGET_STEPS:,} steps of the batch, within "
    f"[{MIN_EPOCHS}, {MAX_EPOCHS}]; the batch one row per {EPOCH_STEPS:.0f} training rows, "
    f"within [{MIN_BATCH}, {SIZES[-1][1]}]"
)
FINE_ROWS = SIZES[0][0]
SCALE_RULE = (
    f"init: {SIZES[0][3]} under {FINE_ROWS:,} training rows, {SIZES[1][3]} from there "
    "(finer features for the rows to fit them)"
)
RATE_RULE = (
    f"init: {LEARNING_RATE:g}, x {TARGET_STEPS:,} / the run's steps where {MAX_EPOCHS} "
    f"epochs make fewer (small tables), at most {MAX_RATE_BOOST:g}x"
)
# init's comment on each setting it sizes, beside the setting's description; on the
# training settings themselves (no description there), the rule alone.
SIZE_RULES = {"ensemble_size": ENSEMBLE_RULE, "frequency_scale": SCALE_RULE}
TRAIN_RULES = {"max_epochs": EPOCHS_RULE, "learning_rate": RATE_RULE}


def ensemble_size(num_training_rows: int) -> int:
    """The members `init` proposes for `num_training_rows` training rows: MAX_MEMBERS
    halved until members x rows is within MAX_MEMBERS x ENSEMBLE_ROWS, at least 1."""
    members = MAX_MEMBERS
    while members > 1 and members * num_training_rows > MAX_MEMBERS * ENSEMBLE_ROWS:
        members //= 2
    return members


def learning_rate(num_training_rows: int, batch: int, epochs: int) -> float:
    """The rate for `epochs` of `num_training_rows` rows in batches of `batch`: LEARNING_RATE
    x the step budget's shortfall (TARGET_STEPS / the run's steps), within [1, MAX_RATE_BOOST],
    to 3 significant digits (a config value a user reads)."""
    steps = epochs * max(num_training_rows, 1) / batch
    boost = min(max(TARGET_STEPS / steps, 1.0), MAX_RATE_BOOST)
    return float(f"{LEARNING_RATE * boost:.3g}")


def sized_training(num_training_rows: int) -> dict[str, Any]:
    """`max_epochs`, the loader's batch size, and the model, its widths, learning rate
    and settings, for a training split of `num_training_rows` rows (TrainConfig fields)."""
    rows = max(num_training_rows, 1)
    largest, width, scale = next(size[1:] for size in SIZES if rows < size[0])
    batch = min(max(MIN_BATCH, math.ceil(rows / EPOCH_STEPS)), largest)
    epochs = min(max(math.ceil(TARGET_STEPS * batch / rows), MIN_EPOCHS), MAX_EPOCHS)
    tabular = TabularConfig(ensemble_size=ensemble_size(rows), frequency_scale=scale)
    return {
        "max_epochs": epochs,
        "loader": {"batch_size": batch},
        "model": {
            "class_path": MODEL,
            "hidden_sizes": [width, width],
            "learning_rate": learning_rate(rows, batch, epochs),
            "tabular": tabular.model_dump(),
        },
    }
