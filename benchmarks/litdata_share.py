"""LitData's decode share per rank, for benchmarks/loader_bench.py: the same shards, W ranks.

LitData 0.2.76 (`StreamingDataset` + `ParquetLoader`, shuffled, 1024-row batches, 0
workers) runs in its own virtual environment (benchmarks/RESULTS.md M13), one process per
rank with a gloo process group, which is how LitData learns its rank. Each rank counts the
rows pyarrow decodes for it (every `ParquetFile.read_row_group` call of its ParquetLoader)
and the rows it serves, so its decode share is measured the way ballast's is
(benchmarks/loader_scale.py). LitData assigns whole files (its chunks) to ranks.

    .venv/bin/python benchmarks/litdata_share.py LITDATA_PYTHON DATASET 1,2,4
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python benchmarks/NAME.py` puts benchmarks/ first on sys.path, `python -m benchmarks.NAME`
# the working directory: either way the repository root goes first, for `benchmarks.*` and
# for ballast itself in a clone without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import json
import os
import socket
import subprocess
import tempfile

import pyarrow.parquet as pq

RANK_SCRIPT = """
import json, sys, time
import pyarrow.parquet as pq
import torch.distributed as dist
source, cache, rank, world, port = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world)
decoded = [0]
read_row_group = pq.ParquetFile.read_row_group
def counted(self, *args, **kwargs):
    table = read_row_group(self, *args, **kwargs)
    decoded[0] += table.num_rows
    return table
pq.ParquetFile.read_row_group = counted
from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming.item_loader import ParquetLoader
started = time.perf_counter()
dataset = StreamingDataset(source, item_loader=ParquetLoader(), cache_dir=f"{cache}/{rank}",
                           shuffle=True, drop_last=True)
served = sum(len(item["id"]) for item in StreamingDataLoader(dataset, batch_size=1024,
                                                             num_workers=0))
print(json.dumps({"served": served, "decoded": decoded[0],
                  "seconds": time.perf_counter() - started}))
dist.destroy_process_group()
"""

INDEX_SCRIPT = (
    "import sys; from litdata import index_parquet_dataset; index_parquet_dataset(sys.argv[1])"
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_ranks(python: str, source: Path, cache: str, world: int) -> list[dict[str, float]]:
    """Every rank of a `world`-rank LitData job at once, each its own process."""
    port = free_port()
    ranks = [
        subprocess.Popen(
            [python, "-c", RANK_SCRIPT, str(source), cache, str(rank), str(world), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    outputs = [rank.communicate() for rank in ranks]
    failed = [
        err.strip().splitlines()[-1:]
        for (_, err), rank in zip(outputs, ranks, strict=True)
        if rank.returncode
    ]
    if failed:
        raise RuntimeError(f"a rank of the {world}-rank LitData pass failed: {failed}")
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


def litdata_share(python: str, paths: list[str], worlds: list[int]) -> dict[int, list[dict]]:
    """Per world size, each rank's rows served and decoded (LitData in its own venv)."""
    with tempfile.TemporaryDirectory() as scratch:
        (source := Path(scratch) / "shards").mkdir()
        for path in paths:
            os.symlink(path, source / Path(path).name)
        subprocess.run([python, "-c", INDEX_SCRIPT, str(source)], check=True, capture_output=True)
        return {
            world: run_ranks(python, source, f"{scratch}/cache-{world}", world) for world in worlds
        }


def share_report(python: str, paths: list[str], worlds: list[int]) -> float | None:
    """Print LitData's per-rank figures and its worst excess of rows decoded over 1/W of
    the split (returned), or why it did not run (None)."""
    if not Path(python).exists():
        print(f"LitData: skipped: {python} not found (see benchmarks/RESULTS.md M13)")
        return None
    try:
        figures = litdata_share(python, paths, worlds)
    except (RuntimeError, subprocess.CalledProcessError) as error:
        print(f"LitData: failed: {error}")
        return None
    split = sum(pq.ParquetFile(path).metadata.num_rows for path in paths)
    print(f"\nLitData {'ranks':>5} {'rank':>4} {'served':>9} {'decoded':>9} {'decoded/split':>13}")
    worst = -1.0
    for world, ranks in figures.items():
        for rank, r in enumerate(ranks):
            worst = max(worst, r["decoded"] / split - 1 / world)
            print(
                f"        {world:5d} {rank:4d} {r['served']:9d} {r['decoded']:9d} "
                f"{r['decoded'] / split:13.3f}"
            )
    print(f"LitData: worst 1/W + {worst:.3f}")
    return worst


if __name__ == "__main__":
    from benchmarks.loader_bench import train_shards

    share_report(sys.argv[1], train_shards(sys.argv[2]), [int(w) for w in sys.argv[3].split(",")])
