"""The `speed` controller over time (training/data/speed_control.py, balance.py,
training/callbacks.py): alike ranks keep `equal`'s split, batches and decode exactly,
through a noisy interval or alternating noise; a change of speed is followed within a
fixed number of steps once two intervals agree; the learned shares survive an epoch and
a checkpoint (on the same world size only); the re-plans read each rank's own work over
at least `balance_every_n_steps` steps; the operator gets a line when the split moves."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import lightning
import numpy as np
import pytest
import torch

from training.callbacks import SpeedReplan
from training.config import LoaderConfig
from training.data.balance import LAG_STEPS, SharePlan, row_bounds
from training.data.batches import Batch
from training.data.loader import ShardStream
from training.data.speed_control import AGREE_BAND, Reading, equal_shares, next_shares

Costs = Callable[[int], Sequence[float]]  # each rank's seconds a row at a step

BATCH, PARTITIONS = 6, 12


def make_stream(root: str, balance: str = "speed") -> ShardStream:
    config = LoaderConfig(batch_size=BATCH, num_partitions=PARTITIONS, balance=balance)
    return ShardStream(root, "train", config, seed=5)


def lockstep(streams: list[ShardStream], costs: Costs, every: int) -> Iterator[list[Batch]]:
    """Every rank's batches step by step; every `every` steps each rank re-plans from the
    same figures (rank r busy `costs(step)[r]` s a sample plus 1 ms a step), as DDP
    gathers them."""
    world = len(streams)
    iterators = [stream.iterate((rank, world)) for rank, stream in enumerate(streams)]
    samples, busy = np.zeros(world), np.zeros(world)
    for step, batches in enumerate(zip(*iterators, strict=True), start=1):
        yield list(batches)
        rows = np.array([len(batch["id"]) for batch in batches], float)
        samples += rows
        busy += rows * np.asarray(costs(step - 1)) + 1e-3
        if step % every == 0:
            for stream in streams:
                state = stream.state_dict()
                stream.shares.replan(
                    state["epoch"],
                    state["samples_consumed"],
                    world * BATCH,
                    list(samples),
                    list(busy),
                )
            samples[:], busy[:] = 0, 0


def alike_with_hiccups(world: int, hiccups: dict[int, int], every: int) -> Costs:
    """Ranks 4 % apart in speed (timing noise inside the equal band), but in interval i of
    `hiccups` rank hiccups[i] is 3x slower (a scheduler hiccup, a GC pause)."""

    def costs(step: int) -> list[float]:
        slow = hiccups.get(step // every)
        return [1e-3 * (3.0 if rank == slow else 1 + 0.04 * (rank % 2)) for rank in range(world)]

    return costs


@pytest.mark.parametrize(("world", "every", "hiccups"), [(2, 1, {}), (3, 1, {}), (2, 2, {3: 1})])
def test_alike_ranks_under_speed_step_and_decode_exactly_as_under_equal(
    dataset_cache: Callable[..., str], world: int, every: int, hiccups: dict[int, int]
) -> None:
    """Invariant: ranks 4 % apart in speed under `speed`, re-planned every step, or every 2
    steps with one interval where rank 1 is 3x slower (one noisy interval), keep the equal
    split exactly at every step, hand out tensors identical to `equal`'s with a
    loss_scale of exactly 1, and decode exactly the rows `equal` decodes on each rank
    (the cuts stay on unit edges)."""
    root = dataset_cache(1200, row_group_size=8)
    speed = [make_stream(root) for _ in range(world)]
    equal = [make_stream(root, "equal") for _ in range(world)]
    costs = alike_with_hiccups(world, hiccups, every)
    iterators = zip(*[s.iterate((r, world)) for r, s in enumerate(equal)], strict=True)
    for index, (step, units) in enumerate(
        zip(lockstep(speed, costs, every), iterators, strict=True)
    ):
        shares = speed[0].shares.shares_at(0, index * world * BATCH, world)
        assert np.array_equal(shares, equal_shares(world)), index
        for batch, unit in zip(step, units, strict=True):
            assert float(batch.pop("loss_scale")) == 1.0
            assert all(torch.equal(batch[name], unit[name]) for name in unit), index
    assert [s.rows_decoded for s in speed] == [s.rows_decoded for s in equal]
    if hiccups:  # the hiccup was read: it is the reading held, not a move
        assert speed[0].shares.last is not None


def simulate(
    costs: Costs, world: int, steps: int, every: int, overhead_s: float
) -> list[np.ndarray]:
    """Each step's rows per rank under a `SharePlan` re-planned every `every` steps from
    modelled busy time (`overhead_s` a step plus the rank's cost per row, `costs(step)`)."""
    global_batch = 64 * world
    plan, history = SharePlan(), []
    samples, busy = np.zeros(world), np.zeros(world)
    for step in range(steps):
        rows = np.diff(row_bounds(plan.shares_at(0, step * global_batch, world), global_batch))
        history.append(rows)
        samples += rows
        busy += overhead_s + rows * np.asarray(costs(step))
        if (step + 1) % every == 0:
            plan.replan(0, (step + 1) * global_batch, global_batch, list(samples), list(busy))
            samples[:], busy[:] = 0, 0
    return history


def settled_at(history: list[np.ndarray], start: int) -> int:
    """The first step from `start` on after which every rank's rows stay within 5 % of the
    final split."""
    final = history[-1]
    settled = [bool(np.all(np.abs(rows - final) <= 0.05 * final)) for rows in history]
    return next(s for s in range(start, len(settled)) if all(settled[s:]))


EVERY = 4
# (ranks, ranks slowed, overhead s a step): steps from the change to the first move, and
# the most steps to within 5 % of the final split (with the change at an interval's start).
SLOW_DOWNS = {
    (2, 1, 0.0): (2 * EVERY + LAG_STEPS, 2 * EVERY + LAG_STEPS),
    (4, 1, 0.0): (2 * EVERY + LAG_STEPS, 2 * EVERY + LAG_STEPS),
    (4, 2, 0.0): (2 * EVERY + LAG_STEPS, 2 * EVERY + LAG_STEPS),
    (2, 1, 0.02): (2 * EVERY + LAG_STEPS, 3 * EVERY + LAG_STEPS),
    (4, 1, 0.02): (2 * EVERY + LAG_STEPS, 4 * EVERY + LAG_STEPS),
    (4, 2, 0.02): (2 * EVERY + LAG_STEPS, 3 * EVERY + LAG_STEPS),
}


@pytest.mark.parametrize("lag", [0, 2])
@pytest.mark.parametrize("case", list(SLOW_DOWNS))
def test_a_sustained_slow_down_is_followed_within_a_fixed_number_of_steps(
    case: tuple[int, int, float], lag: int
) -> None:
    """Invariant: when the last `slowed` ranks turn 2x slower per row at step 40 + `lag`
    (re-plans every 4 steps), the split moves first exactly 2 intervals + LAG_STEPS after
    the change when it starts an interval (both intervals must read it), and every
    rank's rows are within 5 % of the final split from at most N steps after the change:
    10 with no other cost; with a fixed 20 ms a step (which the per-row speed
    under-corrects: a second, smaller move follows) 14 on 2 ranks and 18 on 4; `lag`
    steps into an interval add at most `lag` (the straddling interval waits for the next
    one). The slowed ranks get fewer rows; before the change the split stayed equal."""
    world, slowed, overhead_s = case
    change = 40 + lag
    first_move, most = SLOW_DOWNS[case]
    slow = [1e-3] * (world - slowed) + [2e-3] * slowed
    history = simulate(
        lambda step: [1e-3] * world if step < change else slow, world, 120, EVERY, overhead_s
    )
    assert all(np.ptp(rows) == 0 for rows in history[:change])
    moved = next(s for s in range(change, 120) if not np.array_equal(history[s], history[s - 1]))
    if lag == 0:
        assert moved - change == first_move
    assert settled_at(history, change) - change <= most + lag
    final = history[-1]
    assert final[-1] < final[0] and final[world - slowed - 1] == final[0]


def test_alternating_noise_never_moves_the_split() -> None:
    """Invariant: on 4 alike ranks, intervals where one rank is 3x slower, a different
    rank each time, or one rank every other interval (noise, never the same reading
    twice in a row), leave the split exactly equal at every one of 200 steps."""
    world, every = 4, 4
    for hiccups in (
        {interval: interval % world for interval in range(50)},
        {interval: 2 for interval in range(0, 50, 2)},
    ):
        costs = alike_with_hiccups(world, hiccups, every)
        history = simulate(costs, world, 200, every, overhead_s=0.02)
        assert all(np.ptp(rows) == 0 for rows in history), hiccups


def test_two_readings_agree_only_when_they_call_for_the_same_move() -> None:
    """Invariant: the split moves, at once to the newer target, only when two consecutive
    intervals read the same ranks slower, each beyond the dead band off the shares it ran
    with, to targets within AGREE_BAND of each other; opposite readings, readings too
    far apart, a reading inside the dead band, or a single reading move nothing; two
    readings of alike ranks bring a moved split back to the equal split exactly."""
    even, samples = equal_shares(2), np.array([60.0, 60.0])
    slow = Reading(even, np.array([0.6, 0.4]))  # rank 1 slower: 0.2 equal shares off
    moved, reading = next_shares(even, samples, np.array([1.0, 1.4]), slow)
    assert reading is not None and moved is reading.target
    assert moved == pytest.approx([1.4 / 2.4, 1 / 2.4])  # 0.033 equal shares from slow's
    assert next_shares(even, samples, np.array([1.4, 1.0]), slow)[0] is even  # opposite
    far, _ = next_shares(even, samples, np.array([1.0, 4.0]), slow)  # target 0.2: 0.4 off
    assert far is even and AGREE_BAND < 2 * (0.4 - 0.2)
    off = np.array([0.6, 0.4])
    rows = samples * off * 2
    inside = Reading(off, np.array([0.605, 0.395]))  # within the dead band of its shares
    assert next_shares(off, rows, np.array([1.0, 1.1]), inside)[0] is off
    alike = rows * np.array([1.0, 1.02]) / 60  # rank 1 2 % slower: the equal band
    returned, _ = next_shares(off, rows, alike, Reading(off, even.copy()))
    assert np.array_equal(returned, even)
    assert next_shares(off, rows, alike)[0] is off  # a single reading


def test_a_move_is_followed_by_the_next_interval_that_agrees_with_it() -> None:
    """Invariant: after a move, the reading that made it (run with the old shares) and the
    next one (run with the new) agree when the next still calls for more of the same move:
    a second, smaller move, so a fixed cost a step that the per-row speed under-corrects
    is made up one interval later, not two."""
    plan = SharePlan()
    for position in (6, 12):  # two agreeing readings: rank 1 2x slower a row, 10 ms a step
        shares = plan.replan(0, position, 6, [3.0, 3.0], [0.01 + 0.003, 0.01 + 0.006])
    assert shares[1] < 0.5
    rows = shares * 6
    again = plan.replan(0, 30, 6, list(rows), list(0.01 + rows * [1e-3, 2e-3]))
    assert again[1] < shares[1]


def test_learned_shares_carry_over_epochs_and_restore_on_the_same_world_size_only(
    dataset_cache: Callable[..., str],
) -> None:
    """Invariant: shares learned in epoch 0 (rank 1 3x slower) still apply at the start of
    epoch 1; the stream's state (what a checkpoint holds) carries them: a fresh stream on
    2 ranks starts from them, one on 3 ranks from the equal split; `equal` streams keep
    the state they had; a state with shares that do not fit its world size is refused."""
    root = dataset_cache(300, row_group_size=8)
    streams = [make_stream(root) for _ in range(2)]
    for _ in lockstep(streams, lambda step: [1e-3, 3e-3], every=2):
        pass
    learned = streams[0].shares.shares_at(0, 288, 2)
    assert learned[1] < 0.4
    assert np.array_equal(streams[0].shares.shares_at(1, 0, 2), learned)
    state = streams[0].state_dict()
    assert state["balance_world_size"] == 2 and state["balance_shares"] == list(learned)
    resumed = make_stream(root)
    resumed.load_state_dict(state)
    assert np.array_equal(resumed.shares.shares_at(1, 0, 2), learned)
    assert np.array_equal(resumed.shares.shares_at(1, 0, 3), equal_shares(3))
    assert "balance_shares" not in make_stream(root, "equal").state_dict()
    with pytest.raises(ValueError, match=r"balance_shares \[0.5, 0.6\] are not"):
        make_stream(root).load_state_dict(state | {"balance_shares": [0.5, 0.6]})


def test_the_operator_gets_a_line_when_the_split_moves_by_more_than_ten_percent(
    dataset_cache: Callable[..., str],
) -> None:
    """Invariant: rank 0 notes a line for a move of more than 10 % of the rows a step
    since its last line (from the equal split at first), none for smaller moves."""
    replan = SpeedReplan(make_stream(dataset_cache(300, row_group_size=8)))
    for step, rows in enumerate([[256, 256], [382, 130], [370, 142], [256, 256]]):
        replan.note_move(np.array(rows), step)
    assert replan.moves == [
        "step 1: rank 1 slower: 382/130 rows a step",
        "step 3: ranks alike: 256/256 rows a step",
    ]


def figures(steps: float, data_wait_s: float, compute_s: float, idle_s: float) -> dict[str, float]:
    """One rank's gathered figures of an interval (training/distributed/rank_time.py):
    `idle_s` spent between batches (the interval's all_gather, another rank's logging)."""
    return {
        "steps": steps,
        "samples": 6.0 * steps,
        "data_wait_s": data_wait_s,
        "compute_s": compute_s,
        "allreduce_blocked_s": 0.0,
        "allreduce_hidden_s": 0.0,
        "step_s": data_wait_s + compute_s + idle_s,
    }


def test_re_plans_read_each_ranks_own_work_over_at_least_every_n_steps(
    dataset_cache: Callable[..., str],
) -> None:
    """Invariant: `SpeedReplan` re-plans from a rank's data wait plus compute, not its whole
    step: a rank that waited 3x longer between batches (for a gather, for rank 0's
    logging) but did the same work is alike, over any number of intervals; and short
    intervals (an epoch's last steps) are summed until they hold `every_n_steps` steps:
    intervals of 1 and 2 steps make no reading, the third (4 steps in all) does, and two
    such readings of rank 1 2x slower move the split."""
    stream = make_stream(dataset_cache(300, row_group_size=8))
    replan = SpeedReplan(stream, every_n_steps=4)
    trainer = lightning.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    for _ in range(3):
        replan(trainer, [figures(4, 0.1, 0.3, 0.0), figures(4, 0.1, 0.3, 1.2)])
    assert np.array_equal(stream.shares.shares_at(0, 0, 2), equal_shares(2))
    assert stream.shares.last is not None and stream.shares.last.moves() is False
    stream.shares.last = None
    for steps in (1.0, 2.0):
        replan(trainer, [figures(steps, 0.0, 0.1 * steps, 0), figures(steps, 0.0, 0.2 * steps, 0)])
        assert stream.shares.last is None and replan.moves == []
    replan(trainer, [figures(1, 0.0, 0.1, 0), figures(1, 0.0, 0.2, 0)])
    assert stream.shares.last is not None and stream.shares.last.moves()
    replan(trainer, [figures(4, 0.0, 0.4, 0), figures(4, 0.0, 0.8, 0)])
    assert stream.shares.shares_at(0, LAG_STEPS * 2 * BATCH, 2) == pytest.approx([2 / 3, 1 / 3])
    assert replan.moves == ["step 0: rank 1 slower: 8/4 rows a step"]
