"""Where each rank's time goes (training/distributed/rank_time.py): the split of all-reduce
into blocked and hidden time, the straggler figures, when a re-plan's gather is delivered,
and a real 2-rank job whose rank 1 is made slower, seen in summary.json and in MLflow."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning
import pytest
import torch

from tracking.config import TrackingConfig
from training.config import LoaderConfig, TrainConfig
from training.distributed.comm import Span
from training.distributed.rank_time import (
    RankTimes,
    interval_steps,
    names,
    split_spans,
    straggler,
)
from training.launch import LocalJob, RetryPolicy, run_job
from training.models.config import ModelConfig

SLOW_MODEL = "tests.training.slow_rank_model:SlowRankClassifier"
SLEEP_S = 0.06


def test_all_reduce_after_the_last_launch_is_blocked_and_before_it_hidden() -> None:
    """Backward ends when the last bucket is launched (t=3): of the buckets' union [1, 5]
    2 s ran during backward (hidden) and 2 s after (blocked); an all-reduce outside
    backward (model averaging, 0.5 s) is blocked all along."""
    spans = [
        Span(1.0, 2.5, True),
        Span(2.0, 4.0, True),
        Span(3.0, 5.0, True),
        Span(6.0, 6.5, False),
    ]
    assert split_spans(spans) == pytest.approx((2.0 + 0.5, 2.0))


def test_all_reduces_with_gaps_count_only_the_time_they_ran() -> None:
    """Two buckets with idle time between them: hidden is the first one's second, blocked the
    last one's; the gap counts as neither. No all-reduce at all: nothing blocked or hidden."""
    assert split_spans([Span(0.0, 1.0, True), Span(3.0, 4.0, True)]) == pytest.approx((1.0, 1.0))
    assert split_spans([]) == (0.0, 0.0)


def test_the_straggler_is_the_busiest_rank_against_the_median() -> None:
    """Rank 2 is busy 0.3 s of a 0.32 s step where the median rank is busy 0.1 s: it is 3x
    slower and the job loses 0.2 / 0.32 of each step waiting for it. Without all-reduce
    figures (no DDP hook) there is no straggler to name."""
    per_rank = {
        "busy_s": [0.1, 0.1, 0.3],
        "step_s": [0.32, 0.32, 0.32],
        "allreduce_blocked_s": [0.22, 0.22, 0.02],
    }
    found = straggler(per_rank)
    assert found is not None and found["rank"] == 2
    assert found["slowdown_vs_median"] == pytest.approx(3.0)
    assert found["lost_share"] == pytest.approx(0.2 / 0.32)
    assert straggler({"busy_s": [0.1], "step_s": [0.1]}) is None


class TinyModule(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_re_plans_gather_is_delivered_at_the_next_step_and_the_epochs_last_at_its_end(
    tmp_path: Path,
) -> None:
    """Invariant: with a receiver (`loader.balance: speed`), the gather launched at the end of
    an interval of `every_n_steps` steps is delivered at the end of the next step, holding
    exactly that interval's steps; the epoch's last, shorter interval is gathered at the
    epoch's end; every step is delivered once. 7 steps, every 2: intervals end at steps
    2, 4, 6 and are delivered at 3, 5, 7; step 7 alone at the epoch's end."""
    delivered: list[tuple[int, float]] = []

    def receive(trainer: lightning.Trainer, figures: list[dict[str, float]]) -> None:
        delivered.append((trainer.global_step, figures[0]["steps"]))

    trainer = lightning.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RankTimes(None, receive, every_n_steps=2, min_interval_s=0.0)],
        default_root_dir=tmp_path,
    )
    batches: Any = torch.utils.data.DataLoader(torch.randn(7, 2), batch_size=1)  # type: ignore[arg-type]
    trainer.fit(TinyModule(), train_dataloaders=batches)
    assert delivered == [(3, 2.0), (5, 2.0), (7, 2.0), (7, 1.0)]


def gathered(steps: float, step_s: list[float]) -> list[dict[str, float]]:
    """Every rank's interval figures: `steps` steps taking `step_s[r]` seconds in all."""
    return [dict.fromkeys(names(), 0.0) | {"steps": steps, "step_s": total} for total in step_s]


def test_a_re_plan_interval_lasts_the_least_time_at_the_slowest_ranks_pace() -> None:
    """Invariant: the next interval holds at least `every_n_steps` steps and, at the pace of
    the slowest rank in the last one, at least `min_interval_s`: 4 steps of 10 and 20 ms
    call for 13 steps to last 0.25 s (20 ms a step); 4 steps of 100 ms need no more than
    the 4; nothing measured keeps the 4."""
    assert interval_steps(gathered(4, [0.04, 0.08]), 4, 0.25) == 13
    assert interval_steps(gathered(4, [0.4, 0.4]), 4, 0.25) == 4
    assert interval_steps(gathered(4, [0.0, 0.0]), 4, 0.25) == 4
    assert interval_steps(gathered(5, [0.05, 0.05]), 1, 0.25) == 25


def slow_rank_config(root: str, tmp_path: Path) -> TrainConfig:
    tracking = TrackingConfig(
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        artifact_location=str(tmp_path / "artifacts"),
        system_metrics_interval_s=None,
        registered_model_name=None,
    )
    return TrainConfig(
        dataset=root,
        output_dir=str(tmp_path / "run"),
        max_epochs=1,
        strategy="ddp",
        loader=LoaderConfig(batch_size=16),
        tracking=tracking,
        model=ModelConfig(
            class_path=SLOW_MODEL, hidden_sizes=[16], options={"slow_rank": 1, "sleep_s": SLEEP_S}
        ),
    )


@pytest.mark.slow
def test_a_rank_made_slower_is_named_with_its_time_split(
    dataset_cache: Callable[..., str], tmp_path: Path
) -> None:
    """Rank 1 sleeps SLEEP_S in every step: summary.json's per-rank lists name it the
    straggler, its compute is about SLEEP_S above rank 0's while rank 0 waits that long
    blocked in all-reduce; every figure is present and non-negative, and each rank's step
    time is its data wait + compute + blocked all-reduce to within 20 % + 10 ms (the loop's
    own overhead, and preemption on a shared 2-core host, fall outside the three parts).
    Rank 0 logged both ranks' figures to MLflow as rank_<r>/<figure>."""
    from mlflow.tracking import MlflowClient

    cfg = slow_rank_config(dataset_cache(640, row_group_size=32), tmp_path)
    summary = run_job(
        cfg, LocalJob(num_processes_per_node=2, timeout_s=300, retry=RetryPolicy(attempts=1))
    )
    per_rank = {
        name: summary[f"{name}_per_rank"]
        for name in (
            "step_s",
            "data_wait_s",
            "compute_s",
            "allreduce_blocked_s",
            "allreduce_hidden_s",
            "samples_per_s",
            "busy_s",
        )
    }
    assert all(len(values) == 2 and min(values) >= 0 for values in per_rank.values())
    assert summary["straggler"]["rank"] == 1 and summary["straggler"]["lost_share"] > 0
    assert per_rank["compute_s"][1] - per_rank["compute_s"][0] > 0.6 * SLEEP_S
    assert per_rank["allreduce_blocked_s"][0] > 0.6 * SLEEP_S
    for rank in range(2):
        parts = sum(
            per_rank[name][rank] for name in ("data_wait_s", "compute_s", "allreduce_blocked_s")
        )
        assert abs(per_rank["step_s"][rank] - parts) <= 0.2 * parts + 0.010, (rank, per_rank)
    client = MlflowClient(cfg.tracking.tracking_uri if cfg.tracking else "")
    for rank in range(2):
        history = client.get_metric_history(summary["run_id"], f"rank_{rank}/step_s")
        assert history and all(metric.value > 0 for metric in history)
