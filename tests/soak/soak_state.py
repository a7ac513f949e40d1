"""The soak's settings and state, and the places it runs in: the base sample and a night's
sizes, `Soak` (the scratch directory, the raw bucket on moto behind the fault proxy, the
nights so far), the tallies per fault kind, the output tmpfs, the bucket's filesystem and
the reshard config every night runs with (tests/soak/chain.py runs the nights).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import yaml
from distributed import Client

from preprocessing.config import DatasetSpec, IncrementalConfig, MixConfig, ReshardConfig
from preprocessing.synthetic.tabular import SampleSpec
from preprocessing.toolbox.faults import RetryPolicy
from tests.fault_proxy import FaultyS3Proxy

REPO = Path(__file__).resolve().parents[2]
FAULT_KINDS = ("driver_kill", "worker_kill", "s3_503", "disk_full")
BASE = SampleSpec(
    num_rows=2_000,
    num_files=4,
    num_classes=3,
    num_sources=2,
    num_features=4,
    class_ratio=4.0,
    seed=11,
)
TMPFS_BYTES = 64 << 20


@dataclass
class Tally:
    """Per fault kind: nights drawn, faults that took effect, runs that took one and still
    succeeded, runs that failed and were rerun to a commit, and input rows missing or
    different in the current version."""

    hit: int = 0
    landed: int = 0
    survived: int = 0
    recovered: int = 0
    lost: int = 0


@dataclass
class Night:
    number: int
    fault: str
    landed: bool
    rerun: bool
    how: str
    seconds: float
    lost: int


@dataclass
class Soak:
    """One soak: a scratch directory, the raw bucket, the proxy in front of moto."""

    work: Path
    bucket: str
    proxy: FaultyS3Proxy
    moto_url: str
    seed: int
    tmpfs: bool = False
    client: Client | None = None  # the from-scratch reshards' cluster (sees moto directly)
    # fault kind -> its night (tests/soak/training_nights.py); the servers those nights use
    extra_nights: dict[str, Any] = field(default_factory=dict)
    services: Any = None
    nights: list[Night] = field(default_factory=list)
    expected_s: float = 20.0  # the last clean run's duration: faults land within it

    @property
    def root(self) -> Path:
        return self.work / "out"

    @property
    def kinds(self) -> tuple[str, ...]:
        return (*(FAULT_KINDS if self.tmpfs else FAULT_KINDS[:3]), *self.extra_nights)


def mount_tmpfs(path: Path) -> bool:
    """A TMPFS_BYTES tmpfs at `path` (empty directory); False when mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(path)],
        capture_output=True,
    )
    return done.returncode == 0


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def s3(soak: Soak) -> Any:
    return fsspec.filesystem(
        "s3", client_kwargs={"endpoint_url": soak.moto_url}, skip_instance_cache=True
    )


def config_for(soak: Soak, root: Path) -> ReshardConfig:
    return ReshardConfig(
        dataset=DatasetSpec(inputs=[f"s3://{soak.bucket}/raw/*.parquet"], id_column="id"),
        output_root=str(root),
        target_shard_rows=400,
        rows_per_row_group=64,
        mode="incremental",
        incremental=IncrementalConfig(on_changed_inputs="rebuild"),
        num_workers=2,
        mix=MixConfig(class_weighting="natural"),
        retry=RetryPolicy(attempts=6, first_delay_s=0.1, max_delay_s=0.5),
    )


def config_file(soak: Soak, root: Path, name: str) -> Path:
    path = soak.work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config_for(soak, root).model_dump(mode="json")))
    return path
