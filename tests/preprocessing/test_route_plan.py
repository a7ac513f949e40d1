"""The route plan (preprocessing/plan/route.py), pure: a reshard takes the single pass
exactly when a positive budget holds what it must hold, estimated in decoded bytes; the
estimate covers every decoded input byte, the largest shard and a per-row term, and it
sends the two inputs measured in benchmarks/RESULTS.md M57 where their peaks say."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from hypothesis import given
from hypothesis import strategies as st

from preprocessing.config import ReshardConfig
from preprocessing.plan.route import (
    DECODED_FACTOR,
    ITEM_LIMIT,
    ROW_INDEX_BYTES,
    SINGLE_PASS,
    STAGED,
    STORED_FACTOR,
    held_bytes,
    plan_route,
    runs_in_process,
)
from preprocessing.scan.inputs import text_decoded_bytes
from preprocessing.toolbox.setting_marks import output_neutral_fields

BUDGET_HERE = 2_940_000_000  # one eighth of this host's memory (M57)


@given(
    decoded=st.integers(0, 1 << 44),
    rows=st.integers(0, 1 << 36),
    shards=st.lists(st.integers(0, 1 << 36), max_size=30),
    budget=st.integers(0, 1 << 46),
    files=st.sampled_from([0, 1, 970, ITEM_LIMIT, 5_000]),
)
def test_the_single_pass_runs_exactly_when_its_rows_fit_the_budget(
    decoded, rows, shards, budget, files
) -> None:
    """Invariants: the estimate is at least the decoded inputs, plus the largest shard at
    the inputs' decoded bytes a row, plus the per-row term; single_pass iff budget > 0,
    the estimate <= budget (0 always stages) and files and shards are at most ITEM_LIMIT;
    the record and the log line name the route and say why: the estimate in decoded
    bytes against the budget, or the count of files and shards."""
    shard_rows = np.array(shards, dtype=np.int64)
    route = plan_route(decoded, rows, shard_rows, budget, files)
    largest = max(shards, default=0) * (decoded / rows if rows else 0.0)
    floor = decoded + largest + ROW_INDEX_BYTES * rows
    assert route.held_bytes >= floor * (1 - 1e-12)
    assert route.held_bytes <= DECODED_FACTOR * decoded + floor + 2
    fits = budget > 0 and route.held_bytes <= budget
    few = files + len(shards) <= ITEM_LIMIT
    assert route.name == (SINGLE_PASS if fits and few else STAGED)
    assert route.record() == {
        "route": route.name,
        "held_decoded_bytes": route.held_bytes,
        "budget_bytes": budget,
        "files_and_shards": files + len(shards),
    }
    assert route.line().startswith(f"route {route.name}:") and "\n" not in route.line()
    why = "files and shards" if fits and not few else "decoded"
    assert why in route.line()


@given(
    decoded=st.integers(1, 1 << 40),
    rows=st.integers(1, 1 << 32),
    more=st.integers(1, 1 << 32),
    shards=st.lists(st.integers(0, 1 << 32), min_size=1, max_size=30),
)
def test_more_rows_or_bytes_never_make_the_estimate_smaller(decoded, rows, more, shards) -> None:
    """Invariant: the estimate grows with the decoded bytes and with the rows at the same
    bytes a row (a bigger input never takes the single pass where a smaller one stages)."""
    shard_rows = np.array(shards, dtype=np.int64)
    base = held_bytes(decoded, rows, shard_rows)
    assert held_bytes(decoded + more, rows, shard_rows) >= base
    at_same_row_bytes = -(-decoded * (rows + more) // rows)  # rounded up, in integers
    assert held_bytes(at_same_row_bytes, rows + more, shard_rows) >= base


def test_the_measured_inputs_take_the_route_their_peaks_allow() -> None:
    """Invariant (M57 and M64, the default budget here, 2.94 GB): 1.7 GB in 300 files
    (1.83 GB decoded, 5.52 M rows, 24 shards), whose single pass peaked at 3.19 GB, is
    staged; 5,000 files of 2,000 rows (0.33 GB decoded, 10 M rows, 2,000 shards), whose
    single pass on threads took 25.9 s against 12.0 s staged on worker processes, is
    staged for its files and shards though its rows fit (its pass peaked at 1.60 GB);
    both estimates are at least the measured peaks; 64 files into 24 shards take the
    pass."""
    big = plan_route(1_830_000_000, 5_519_480, np.full(24, 5_519_480 // 24), BUDGET_HERE, 300)
    pieces = plan_route(331_000_000, 10_000_000, np.full(2_000, 5_000), BUDGET_HERE, 5_000)
    small = plan_route(60_000_000, 162_337, np.full(24, 6_765), BUDGET_HERE, 64)
    assert big.name == STAGED and big.held_bytes >= 3_190_000_000
    assert pieces.name == STAGED and pieces.held_bytes >= 1_600_000_000
    assert pieces.held_bytes <= BUDGET_HERE and "files and shards" in pieces.line()
    assert small.name == SINGLE_PASS


@given(
    stored=st.integers(0, 1 << 44),
    more=st.integers(0, 1 << 40),
    budget=st.integers(0, 1 << 46),
    files=st.integers(0, 3 * ITEM_LIMIT),
    more_files=st.integers(0, ITEM_LIMIT),
)
def test_threads_in_process_only_while_the_inputs_stored_bytes_leave_room(
    stored, more, budget, files, more_files
) -> None:
    """Invariants: a reshard runs on threads in its own process exactly when STORED_FACTOR
    times its stored input bytes fit a positive budget and it has at most ITEM_LIMIT
    files; never with budget 0 (the staged route forced); more bytes or more files never
    turn it back to threads; the measured inputs go where M64 says under this host's
    default budget (0.06 GB in 64 files: threads; 5,000 small files, 0.29 GB: worker
    processes, for their count; 1.7 GB in 300 files: worker processes, for their bytes),
    and each held estimate from M57 is within the factor."""
    fits = budget > 0 and STORED_FACTOR * stored <= budget
    assert runs_in_process(stored, budget, files) == (fits and files <= ITEM_LIMIT)
    assert not runs_in_process(stored, 0, files)
    if not runs_in_process(stored, budget, files):
        assert not runs_in_process(stored + more, budget, files + more_files)
    assert runs_in_process(60_000_000, BUDGET_HERE, 64)
    assert not runs_in_process(294_000_000, BUDGET_HERE, 5_000)
    assert not runs_in_process(1_760_000_000, BUDGET_HERE, 300)
    pieces = plan_route(331_000_000, 10_000_000, np.full(2_000, 5_000), BUDGET_HERE)
    big = plan_route(1_830_000_000, 5_519_480, np.full(24, 5_519_480 // 24), BUDGET_HERE)
    assert pieces.held_bytes <= STORED_FACTOR * 294_000_000
    assert big.held_bytes <= STORED_FACTOR * 1_760_000_000


WIDTHS = {  # a row's bytes of each column in the bound, written out by hand
    pa.int8(): 1,
    pa.int64(): 8,
    pa.float32(): 4,
    pa.bool_(): 1,
    pa.timestamp("us"): 8,
    pa.decimal128(20, 2): 16,
    pa.string(): 8,
    pa.list_(pa.float32()): 8,
    pa.struct([("a", pa.int64())]): 8,
}


@given(
    rows=st.integers(0, 1 << 30),
    stored=st.integers(0, 1 << 40),
    types=st.lists(st.sampled_from(list(WIDTHS)), max_size=12),
)
def test_a_text_files_bound_is_its_bytes_and_its_columns_widths(rows, stored, types) -> None:
    """Invariant: a CSV/JSON file's decoded bound is its bytes plus, a row, each
    fixed-width column's width (at least a byte) and 8 bytes for any other column."""
    schema = pa.schema([(f"c{i}", t) for i, t in enumerate(types)])
    widths = sum(WIDTHS[t] for t in types)
    assert text_decoded_bytes(schema, rows, stored) == stored + rows * widths


cells = st.one_of(
    st.integers(-9, 9),
    st.integers(-(1 << 62), 1 << 62),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(alphabet='ab,"é\n', max_size=20),
    st.none(),
)


@given(table=st.lists(st.lists(cells, min_size=3, max_size=3), min_size=1, max_size=60))
def test_a_csv_decodes_within_its_bound(table) -> None:
    """Invariant: a real CSV, read by pyarrow (one-digit integers, quoted strings with
    commas and newlines, nulls, booleans), decodes to at most `text_decoded_bytes` of it."""
    columns = list(zip(*table, strict=True))
    data = pa.table(
        {
            f"c{i}": pa.array([str(v) if v is not None else None for v in column])
            for i, column in enumerate(columns)
        }
    )
    sink = io.BytesIO()
    pacsv.write_csv(data, sink)
    text = sink.getvalue()
    read = pacsv.read_csv(io.BytesIO(text))
    assert read.num_rows == len(table)
    assert read.nbytes <= text_decoded_bytes(read.schema, read.num_rows, len(text))


def test_the_budget_is_output_neutral_and_unset_by_default() -> None:
    """Invariant: `single_pass_bytes` never enters the version id, and defaults to None
    (an eighth of the host's memory, chosen by the driver)."""
    assert "single_pass_bytes" in output_neutral_fields(ReshardConfig)
    assert ReshardConfig.model_fields["single_pass_bytes"].default is None
