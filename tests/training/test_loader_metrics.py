"""Loader metrics: samples per second and the time a consumer waited for data."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import torch

from training.config import LoaderConfig
from training.data.loader import ShardStream, StreamLoader
from training.data.wait import DataWaitMeter, interval

DELAY_S = 0.02


def slow_batches(count: int, delay_s: float) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of 4 ids, each produced after `delay_s` of sleep."""
    for index in range(count):
        time.sleep(delay_s)
        yield {"id": torch.arange(4) + 4 * index}


def test_a_slow_producer_shows_as_waiting() -> None:
    """When batches take long to produce and the consumer does nothing, nearly all the wall
    time is data wait; samples and batches are counted exactly."""
    meter = DataWaitMeter()
    assert len(list(meter.timed(slow_batches(10, DELAY_S)))) == 10
    figures = meter.metrics()
    assert (figures["samples"], figures["batches"]) == (40, 10)
    assert figures["data_wait_s"] >= 10 * DELAY_S and figures["data_wait_fraction"] > 0.9
    assert figures["samples_per_s"] == pytest.approx(40 / figures["wall_s"])


def test_a_slow_consumer_shows_as_not_waiting() -> None:
    """When the consumer's step takes the time and batches are ready, the wait fraction is
    small and the wall time covers the consumer's steps."""
    meter = DataWaitMeter()
    for _ in meter.timed(slow_batches(10, 0.0)):
        time.sleep(DELAY_S)
    figures = meter.metrics()
    assert figures["wall_s"] >= 9 * DELAY_S
    assert 0.0 <= figures["data_wait_fraction"] < 0.5


def test_interval_gives_the_rates_between_two_readings() -> None:
    """The figures between two readings are differences of the counters, and their rates."""
    before = {"samples": 100.0, "batches": 10.0, "wall_s": 2.0, "data_wait_s": 0.5}
    after = {"samples": 300.0, "batches": 30.0, "wall_s": 4.0, "data_wait_s": 0.7}
    figures = interval(before, after)
    assert figures["samples_per_s"] == pytest.approx(100.0)
    assert figures["data_wait_fraction"] == pytest.approx(0.1)


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_stream_loader_counts_what_it_hands_out(
    dataset_cache: Callable[..., str], num_workers: int
) -> None:
    """StreamLoader.metrics() counts every sample of every pass, accumulates over passes,
    and keeps the wait within the wall time."""
    stream = ShardStream(
        dataset_cache(300, row_group_size=16), "train", LoaderConfig(batch_size=10), seed=0
    )
    loader = StreamLoader(stream, num_workers=num_workers)
    for _ in range(2):
        for _ in loader:
            time.sleep(0.001)
    figures = loader.metrics()
    assert (figures["samples"], figures["batches"]) == (600, 60)
    assert 0 < figures["data_wait_s"] <= figures["wall_s"]
