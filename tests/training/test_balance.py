"""Balancing each global step's rows among ranks (training/data/balance.py), on real
streams: the slices cover every row of `equal`'s global step once, in the same order, on
any world size and speed ratio; every rank yields the same number of batches; a resume on
another world size continues the stream; the weighted loss gives `equal`'s gradient; token
splits follow the shares. The shares and cuts alone: tests/training/test_balance_shares.py."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from training.config import LoaderConfig, TrainConfig
from training.data.balance import rank_slice, row_bounds
from training.data.batches import Batch
from training.data.loader import ShardStream
from training.data.speed_control import FLOOR
from training.models.classifier import FeatureClassifier

BATCH = 6
PARTITIONS = 12  # divisible by every world size of the grid


def make_stream(root: str, balance: str = "speed", **fields: object) -> ShardStream:
    config = LoaderConfig(batch_size=BATCH, num_partitions=PARTITIONS, balance=balance, **fields)
    return ShardStream(root, "train", config, seed=5)


def lockstep(streams: list[ShardStream], costs: list[float], every: int) -> Iterator[list[Batch]]:
    """Every rank's batches step by step, as DDP runs them; every `every` steps each rank
    re-plans from the same simulated figures (rank r busy `costs[r]` s per sample plus
    1 ms a step), as the per-interval all_gather hands them to every rank."""
    world = len(streams)
    iterators = [stream.iterate((rank, world)) for rank, stream in enumerate(streams)]
    samples = np.zeros(world)
    for step, batches in enumerate(zip(*iterators, strict=True), start=1):
        yield list(batches)
        samples += [len(batch["id"]) for batch in batches]
        if step % every == 0:
            busy = list(samples * np.asarray(costs) + 1e-3 * every)
            for stream in streams:
                state = stream.state_dict()
                stream.shares.replan(
                    state["epoch"], state["samples_consumed"], world * BATCH, list(samples), busy
                )
            samples[:] = 0


def step_ids(steps: list[list[Batch]]) -> list[list[int]]:
    """Each global step's ids, rank after rank."""
    return [[i for batch in step for i in batch["id"].tolist()] for step in steps]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("ratio", [1.0, 2.0, 5.0])
def test_speed_slices_cover_each_equal_step_once(
    dataset_cache: Callable[..., str], world: int, ratio: float
) -> None:
    """Invariant: under `speed`, with the last rank `ratio` x slower, every global step holds
    exactly `equal`'s rows of that step in `equal`'s order (so each sample once per epoch),
    every rank yields a batch at every step (equal optimizer steps), and once re-planned the
    slow rank takes fewer rows than rank 0 (more when it is not slower: never fewer)."""
    root = dataset_cache(300, row_group_size=8)
    equal = step_ids(
        [
            list(step)
            for step in zip(
                *[make_stream(root, "equal").iterate((r, world)) for r in range(world)], strict=True
            )
        ]
    )
    costs = [1e-3] * (world - 1) + [ratio * 1e-3]
    steps = list(lockstep([make_stream(root) for _ in range(world)], costs, every=2))
    assert step_ids(steps) == equal
    assert len(equal) == 300 // (world * BATCH)
    late = [len(batch["id"]) for batch in steps[-1]]
    assert sum(late) == world * BATCH
    if world > 1 and ratio > 1:
        assert late[-1] < late[0]
        assert late[-1] >= int(FLOOR * BATCH)
    elif world > 1:
        assert max(late) - min(late) <= 1


def test_a_resume_on_another_world_size_under_speed_trains_the_rest_once(
    dataset_cache: Callable[..., str],
) -> None:
    """Invariant: 3 steps at 2 ranks under `speed` (rank 1 3x slower), then a resume from
    that state on 3 ranks, train together exactly the epoch's rows `equal` gives at 2 then
    3 ranks from the same position: each sample once, nothing skipped."""
    root = dataset_cache(300, row_group_size=8)
    first = [make_stream(root) for _ in range(2)]
    before = []
    for step in lockstep(first, [1e-3, 3e-3], every=1):
        before += [i for batch in step for i in batch["id"].tolist()]
        if len(before) == 3 * 2 * BATCH:
            break
    state = first[0].state_dict()
    assert state["samples_consumed"] == 3 * 2 * BATCH
    second = [make_stream(root) for _ in range(3)]
    for stream in second:
        stream.load_state_dict(state)
    after = [
        i
        for step in lockstep(second, [1e-3, 3e-3, 1e-3], every=1)
        for batch in step
        for i in batch["id"].tolist()
    ]
    assert len(before + after) == len(set(before + after))
    rest = [make_stream(root, "equal") for _ in range(3)]
    for stream in rest:
        stream.load_state_dict(state)
    expected = [
        i
        for step in zip(*[s.iterate((r, 3)) for r, s in enumerate(rest)], strict=True)
        for batch in step
        for i in batch["id"].tolist()
    ]
    assert len(after) == len(expected) > 0
    assert sorted(after) == sorted(expected)


def test_the_weighted_loss_gives_the_equal_gradient(dataset_cache: Callable[..., str]) -> None:
    """Invariant: on one global step of 4 ranks, DDP's average of the ranks' gradients of
    `training_step`'s loss is the same (to float rounding) whether the step is split
    equally or in slices of 2, 5, 9 and 8 rows with their `loss_scale`."""
    root = dataset_cache(300, row_group_size=8)
    model = FeatureClassifier(16, list(range(10)), {"hidden_sizes": [8]})
    model.log = lambda *args, **kwargs: None  # type: ignore[method-assign]  # no trainer here
    equal = [next(make_stream(root, "equal").iterate((r, 4))) for r in range(4)]
    whole = {name: torch.cat([batch[name] for batch in equal]) for name in equal[0]}
    shares = np.array([2, 5, 9, 8]) / 24
    sliced = [rank_slice(whole, shares, r, "samples") for r in range(4)]
    assert [len(batch["id"]) for batch in sliced] == [2, 5, 9, 8]

    def averaged_gradient(batches: list[Batch]) -> torch.Tensor:
        model.zero_grad()
        for batch in batches:
            (model.training_step(batch, 0) / len(batches)).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    expected = averaged_gradient(equal)
    assert torch.allclose(averaged_gradient(sliced), expected, rtol=1e-5, atol=1e-7)
    assert expected.abs().sum() > 0


def test_balanced_loaders_refuse_workers_and_sharded_strategies() -> None:
    """Invariant: `balance: speed` with DataLoader workers, and `balance_by: tokens` under
    FSDP, are refused with errors naming the fields."""
    with pytest.raises(ValueError, match=r"loader\.num_workers to 0"):
        LoaderConfig(balance="speed", num_workers=2)
    with pytest.raises(ValueError, match="balance_by: tokens apply to ddp, not fsdp"):
        TrainConfig(
            dataset="d", output_dir="o", strategy="fsdp", loader=LoaderConfig(balance_by="tokens")
        )


def test_validation_is_split_equally_under_speed(dataset_cache: Callable[..., str]) -> None:
    """Invariant: with `balance: speed` and `balance_by: tokens` for training, the holdout
    stream is padded and split equally (its figures are exact sums over whole batches)."""
    from training.data.datamodule import StreamDataModule

    root = dataset_cache(120, holdout_rows=30, row_group_size=8)
    data = StreamDataModule(
        root, LoaderConfig(batch_size=4, balance="speed", balance_by="tokens"), seed=0
    )
    assert data.train_stream.config.balanced
    assert data.val_stream is not None
    held = data.val_stream.config
    assert (held.balance, held.balance_by, held.remainder) == ("equal", "samples", "pad")
    assert not held.balanced


def test_uneven_token_sequences_are_padded_with_zero_and_split_by_real_tokens(
    tmp_path: Path,
) -> None:
    """Invariant: a token dataset with `min_seq_len` has sequences of every length in
    [min_seq_len, seq_len], real ids >= 1 and a tail of pad id 0; a spec without it keeps
    the version id it had before the field existed. Streamed under `balance_by: tokens`
    on 2 ranks, each step's slices cover its rows once and their real-token sums differ by
    at most the longest sequence."""
    from preprocessing.synthetic.tokens import TokenDatasetSpec, write_token_dataset

    assert TokenDatasetSpec().version_id() == "tokens-bb71738ffd9be4f0"
    spec = TokenDatasetSpec(
        num_rows=384,
        holdout_rows=0,
        seq_len=16,
        min_seq_len=2,
        vocab_size=64,
        rows_per_shard=128,
        rows_per_row_group=32,
    )
    root = write_token_dataset(str(tmp_path / "tokens"), spec)
    config = LoaderConfig(batch_size=16, balance_by="tokens", num_partitions=4)
    streams = [ShardStream(root, "train", config, seed=1) for _ in range(2)]
    steps = list(zip(*[s.iterate((r, 2)) for r, s in enumerate(streams)], strict=True))
    features = torch.cat([batch["features"] for step in steps for batch in step])
    lengths = (features != 0).sum(dim=1)
    assert int(lengths.min()) == 2 and int(lengths.max()) == 16
    assert bool(((features != 0).cumprod(dim=1).sum(dim=1) == lengths).all())  # tail of 0s
    ids = [i for step in steps for batch in step for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(384))
    for step in steps:
        sums = [int((batch["features"] != 0).sum()) for batch in step]
        assert abs(sums[0] - sums[1]) <= 16


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("remainder", ["drop", "pad"])
def test_speed_slices_are_the_whole_step_slices_byte_for_byte(
    dataset_cache: Callable[..., str], world: int, remainder: str
) -> None:
    """Invariant: under `speed` by samples, a rank that reads only the units its slice
    overlaps hands out, at every step of a run re-planned every step (rank 0 3x slower),
    exactly the tensors and `loss_scale` that `rank_slice` cuts from `equal`'s whole step
    with the shares of that step, padding rows of the last step included."""
    root = dataset_cache(300, row_group_size=8)
    streams = [make_stream(root, remainder=remainder) for _ in range(world)]
    equal = [
        make_stream(root, "equal", remainder=remainder).iterate((r, world)) for r in range(world)
    ]
    costs = [3e-3] + [1e-3] * (world - 1)
    moved = 0
    for index, (step, units) in enumerate(
        zip(lockstep(streams, costs, every=1), zip(*equal, strict=True), strict=True)
    ):
        shares = streams[0].shares.shares_at(0, index * world * BATCH, world)
        moved += int(np.abs(shares - 1 / world).max() > 0.01)
        whole = {name: torch.cat([unit[name] for unit in units]) for name in units[0]}
        for rank, batch in enumerate(step):
            expected = rank_slice(whole, shares, rank, "samples")
            assert batch.keys() == expected.keys()
            for name, tensor in expected.items():
                assert torch.equal(batch[name], tensor), (index, rank, name)
    assert moved > 0  # the shares did move away from equal


@pytest.mark.parametrize(
    ("shares", "units"),
    [
        ((0.25, 0.75), (1, 2)),
        ((0.25, 0.375, 0.375), (1, 2, 2)),
        ((0.1, 0.2, 0.3, 0.4), (1, 2, 2, 2)),
        ((0.25, 0.25, 0.25, 0.25), (1, 1, 1, 1)),
    ],
)
def test_a_speed_rank_decodes_only_the_units_its_slice_overlaps(
    dataset_cache: Callable[..., str], shares: tuple[float, ...], units: tuple[int, ...]
) -> None:
    """Invariant: under `speed` by samples with fixed shares, rank r decodes (rows_decoded)
    no more than the `equal` ranks of the unit positions its slice overlaps together: a
    step's unit k always comes from the partitions p = k (mod W), and a slice of share s
    overlaps at most s x W + 2 units (one cut inside a unit at each end), so its decode
    share is at most s + 2/W plus `equal`'s edge row groups, not the whole split. The
    units listed are those row_bounds(shares, W x 6) overlaps."""
    root = dataset_cache(1200, row_group_size=8)
    world = len(shares)
    decoded, taken = [], []
    for balance in ("equal", "speed"):
        for rank in range(world):
            stream = make_stream(root, balance)
            stream.shares.world_size = world  # the shares of the whole epoch, from step 0
            stream.shares.changes = [((0, 0), np.array(shares))]
            taken.append(sum(len(batch["id"]) for batch in stream.iterate((rank, world))))
            decoded.append(stream.rows_decoded / stream.num_rows)
    equal, speed = decoded[:world], decoded[world:]
    counts = np.diff(row_bounds(np.array(shares), world * BATCH))
    assert taken[world:] == (1200 // (world * BATCH) * counts).tolist()
    edge = max(equal) - 1 / world  # the row groups at the ends of a partition run
    for rank, share in enumerate(shares):
        assert speed[rank] <= units[rank] * (1 / world + edge) + 1e-9
        assert speed[rank] <= share + 2 / world + units[rank] * edge + 1e-9
        assert speed[rank] >= share - edge
    assert min(speed) < 1 / world + edge + 1e-9 < 1.0  # the smallest share: not everything


def test_closing_a_speed_stream_mid_epoch_stops_its_producer(
    dataset_cache: Callable[..., str],
) -> None:
    """Invariant: under `speed` the batch producer waits for shares that are not final yet;
    closing the iterator after two batches ends that wait: close returns at once and no
    thread of the stream is left running."""
    import threading
    import time

    stream = make_stream(dataset_cache(300, row_group_size=8))
    before = threading.active_count()
    batches = stream.iterate((0, 2))
    assert isinstance(batches, Generator)  # closing it is what stops the producer
    next(batches), next(batches)
    time.sleep(0.2)  # the producer reaches the horizon and waits there
    assert threading.active_count() > before
    began = time.monotonic()
    batches.close()
    assert time.monotonic() - began < 5.0
    assert threading.active_count() == before
