"""`train.select_best` (training/selection.py): the rule on modelled figure sequences, the
callback under a real Lightning Trainer (one process), its checkpointed state, and the
refusals (no validation split, sharded strategies)."""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Iterator
from typing import Any

import lightning
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from flows.cli.summary import kept_epoch
from training.config import SelectBestConfig, TrainConfig, check_selection_split
from training.selection import BestEpoch, SelectBest

# Few distinct values, so that ties are common; NaN now and then.
FIGURES = st.lists(st.sampled_from([0.1, 0.2, 0.3, 0.5, float("nan")]), min_size=1, max_size=12)


def expected(figures: list[float], patience: int, mode: str) -> tuple[int, int | None, bool]:
    """(epochs run, chosen epoch, patience ran out) written out plainly: run until
    `patience` epochs in a row bring no strictly better figure than every earlier one;
    the earliest best wins."""
    best: float | None = None
    chosen, waited = None, 0
    for epoch, value in enumerate(figures):
        sign = 1 if mode == "min" else -1
        if not math.isnan(value) and (best is None or sign * value < sign * best):
            best, chosen, waited = value, epoch, 0
        else:
            waited += 1
        if waited == patience:
            return epoch + 1, chosen, True
    return len(figures), chosen, False


@given(figures=FIGURES, patience=st.integers(1, 4), mode=st.sampled_from(["min", "max"]))
def test_rule_stops_after_patience_and_keeps_the_earliest_best(
    figures: list[float], patience: int, mode: Any
) -> None:
    """Fed epoch by epoch until it says stop, the rule stops exactly after `patience`
    epochs without a strictly better figure, and its epoch is the first best (argmin for
    min, argmax for max; NaN never chosen) of the epochs it saw."""
    rule = BestEpoch(mode, patience)
    run = 0
    for epoch, value in enumerate(figures):
        rule.see(epoch, value)
        run = epoch + 1
        if rule.should_stop:
            break
    assert (run, rule.epoch, rule.should_stop) == expected(figures, patience, mode)
    seen = [v for v in figures[:run] if not math.isnan(v)]
    if seen:
        best = min(seen) if mode == "min" else max(seen)
        assert rule.epoch == figures.index(best) and rule.value == best


class ScriptedFigure(lightning.LightningModule):
    """A linear layer that SGD moves every step, whose `val_loss` at epoch e is
    `figures[e]` (the modelled sequence), and a confusion matrix naming the epoch."""

    def __init__(self, figures: list[float]) -> None:
        super().__init__()
        self.figures = figures
        self.layer = torch.nn.Linear(3, 2)
        self.last_confusion: Any = None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def on_validation_epoch_end(self) -> None:
        epoch = self.current_epoch if not self.trainer.sanity_checking else 0
        self.last_confusion = torch.full((2, 2), epoch).numpy()
        self.log("val_loss", self.figures[min(epoch, len(self.figures) - 1)])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Snapshots(lightning.Callback):
    """The weights at each validation's end (sanity check aside)."""

    def __init__(self) -> None:
        self.weights: list[dict[str, torch.Tensor]] = []

    def on_validation_end(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self.weights.append({k: v.clone() for k, v in pl_module.state_dict().items()})


@pytest.fixture(autouse=True)
def quiet_lightning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many|log)")
        yield


def fit_scripted(figures: list[float], patience: int) -> tuple[Any, SelectBest, Snapshots]:
    data = torch.utils.data.TensorDataset(
        torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    )
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, snapshots = ScriptedFigure(figures), Snapshots()
    select = SelectBest(SelectBestConfig(patience=patience))
    trainer = lightning.Trainer(
        max_epochs=len(figures),
        callbacks=[snapshots, select],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
    )
    trainer.fit(model, loader, loader)
    return model, select, snapshots


@settings(max_examples=8, deadline=None)
@given(
    figures=st.lists(st.sampled_from([0.1, 0.2, 0.3]), min_size=1, max_size=6),
    patience=st.integers(1, 3),
)
def test_trainer_stops_and_restores_exactly_the_best_epoch(
    figures: list[float], patience: int
) -> None:
    """Under a real Trainer, training stops after `patience` epochs without a lower
    `val_loss`, and the model ends with exactly the weights it had at the first epoch of
    the lowest figure (not the last epoch's), its confusion matrix that epoch's."""
    model, select, snapshots = fit_scripted(figures, patience)
    run, chosen, stopped = expected(figures, patience, "min")
    assert len(snapshots.weights) == run and select.best.epoch == chosen
    assert chosen is not None
    for name, value in model.state_dict().items():
        assert torch.equal(value, snapshots.weights[chosen][name]), name
    assert (model.last_confusion == chosen).all()
    assert select.val_loss == pytest.approx(figures[chosen])
    assert select.summary()["stopped_early"] == stopped


def test_checkpointed_state_loads_weights_only() -> None:
    """The callback's state (its copy of the best weights included) loads with
    `weights_only=True`, as a resumed run loads its checkpoint, and keeps the choice."""
    _, select, _ = fit_scripted([0.3, 0.1, 0.2, 0.2], patience=2)
    buffer = io.BytesIO()
    torch.save(select.state_dict(), buffer)
    buffer.seek(0)
    again = SelectBest(SelectBestConfig(patience=2))
    again.load_state_dict(torch.load(buffer, weights_only=True))
    assert (again.best.epoch, again.best.waited) == (1, 2)
    assert again.best.value == select.best.value == pytest.approx(0.1)
    assert select.weights is not None and again.weights is not None
    assert all(torch.equal(again.weights[k], v) for k, v in select.weights.items())


def test_no_validation_split_is_refused_unless_on_holdout() -> None:
    """A version without a validation split is refused, naming the fields; with
    `on_holdout` it selects on the holdout and warns; off, nothing is checked."""
    with pytest.raises(ValueError, match=r"dataset\.validation_fraction"):
        check_selection_split(SelectBestConfig(), "holdout")
    with pytest.raises(ValueError, match="neither validation nor holdout"):
        check_selection_split(SelectBestConfig(on_holdout=True), None)
    with pytest.warns(UserWarning, match="holdout chooses the epoch"):
        check_selection_split(SelectBestConfig(on_holdout=True), "holdout")
    check_selection_split(SelectBestConfig(), "validation")
    check_selection_split(None, None)


@pytest.mark.parametrize("strategy", ["fsdp", "tp"])
def test_sharded_strategies_are_refused(strategy: str) -> None:
    """select_best with FSDP or tensor parallel is refused naming both settings; off by
    default, so a config without it is as before."""
    with pytest.raises(ValidationError, match=f"select_best applies to ddp or auto.*{strategy}"):
        TrainConfig(dataset="d", output_dir="o", strategy=strategy, select_best={})
    assert TrainConfig(dataset="d", output_dir="o", strategy=strategy).select_best is None
    with pytest.raises(ValidationError, match=r"select_best\.patience"):
        TrainConfig(dataset="d", output_dir="o", select_best={"patience": 0})


def test_console_names_the_kept_epoch() -> None:
    """The run's console line names the epoch kept and the figure that chose it, as the
    callback's summary (summary.json's `selection`) says; nothing without a selection."""
    _, select, _ = fit_scripted([0.3, 0.1, 0.2, 0.2, 0.4], patience=2)
    assert kept_epoch(select.summary()) == "; kept epoch 1 of 0-3 by val_loss"
    assert kept_epoch(None) == ""
