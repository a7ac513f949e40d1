"""The soak of the nightly incremental chain (tests/soak/chain.py, training nights in
tests/soak/training_nights.py): N nights, one seeded fault a night, every invariant
checked after each night and the table printed.

`make soak` runs 30 nights (BALLAST_SOAK_NIGHTS=30); inside `make test` this runs
BALLAST_SOAK_NIGHTS or SUITE_NIGHTS (2) nights, fewer than the issue's 5: each night is
one or two `python -m preprocessing` runs with their own clusters and a from-scratch
reshard, 10-150 s a night on this shared 2-core host (2 nights: 60 s at load 6), so 5
nights would pass the suite's ~90 s budget. Seed 24 draws no training night among the
suite's (the MLflow and Prefect servers start at the first one): in 30 nights each of the
7 kinds comes up 4 or 5 times.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import fsspec
import pytest
from distributed import Client

from preprocessing.driver.cluster import local_cluster
from tests.fault_proxy import FaultyS3Proxy
from tests.soak.chain import compaction_matches, soak_nights, table
from tests.soak.soak_state import Soak, mount_tmpfs, unmount
from tests.soak.training_nights import TRAINING_NIGHTS

SUITE_NIGHTS = 2  # the base night and one faulted night (driver_kill under seed 24)
NIGHTS = int(os.environ.get("BALLAST_SOAK_NIGHTS", SUITE_NIGHTS))
# Reshard subprocesses, each with its own Dask cluster, and moto; the suite's per-test
# timeout (600 s) would stop a soak of more than a few nights: 600 s a night instead (a
# training night runs the whole pipeline, twice when it failed).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600 * NIGHTS + 300)]


def test_nightly_chain_survives_a_fault_a_night(tmp_path: Path, s3_endpoint: str) -> None:
    """Invariants, after every night of the chain with its fault: `_CURRENT` names a
    committed version, `ballast verify --deep` finds the chain whole, the current rows
    equal a from-scratch reshard's (0 rows lost), no dead attempt's staging is left, and
    a failed run commits on rerun; after a training night every MLflow run is FINISHED or
    FAILED with a reason and no run has two registered model versions; after the last
    night a compaction is byte-identical to the from-scratch reshard."""
    nights = NIGHTS
    bucket = f"soak-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("s3", skip_instance_cache=True).mkdir(bucket)
    with (
        FaultyS3Proxy(s3_endpoint) as proxy,
        local_cluster(2) as cluster,
        Client(cluster) as client,
    ):
        soak = Soak(
            tmp_path,
            bucket,
            proxy,
            s3_endpoint,
            seed=int(os.environ.get("BALLAST_SOAK_SEED", "24")),
            client=client,
            extra_nights=TRAINING_NIGHTS,
        )
        soak.tmpfs = mount_tmpfs(soak.root)
        try:
            tallies = soak_nights(soak, nights)
            compacted = compaction_matches(soak)
        finally:
            if soak.tmpfs:
                unmount(soak.root)
            if soak.services is not None:
                soak.services.stop()
    print(
        f"\n{nights} nights, seed {soak.seed}; disk_full "
        f"{'on a tmpfs' if soak.tmpfs else 'left out (mount not allowed)'}\n{table(tallies)}"
    )
    assert sum(t.lost for t in tallies.values()) == 0
    assert compacted, "the compaction of the chain differs from the from-scratch reshard"
    if nights >= 30:  # the bar for the full soak
        assert all(t.hit >= 3 for t in tallies.values()), table(tallies)
