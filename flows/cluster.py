"""The one Dask cluster factory: local processes, an existing scheduler, Kubernetes or HPC.

Chosen by config, never by code path: the same flow runs on a laptop and on a
cluster, differing only in this setting and in URIs.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from distributed import Client
from pydantic import BaseModel, ConfigDict, Field

from preprocessing.reshard import local_cluster


class DaskConfig(BaseModel):
    """Where the reshard's Dask tasks run."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["local", "address", "kubernetes", "slurm", "pbs"] = Field(
        "local", description="`local`: worker processes here; `address`: an existing "
        "scheduler; `kubernetes` / `slurm` / `pbs`: dask-kubernetes / dask-jobqueue.")
    address: str | None = Field(None, description="Scheduler address for kind `address`.")
    num_workers: int = Field(2, gt=0, description="Workers to start (all kinds but address).")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the cluster class.")


_EXTERNAL = {
    "kubernetes": ("dask_kubernetes.operator", "KubeCluster", "dask-kubernetes"),
    "slurm": ("dask_jobqueue", "SLURMCluster", "dask-jobqueue"),
    "pbs": ("dask_jobqueue", "PBSCluster", "dask-jobqueue"),
}


def external_cluster(config: DaskConfig) -> Any:
    """A dask-kubernetes or dask-jobqueue cluster scaled to `num_workers`."""
    module_name, class_name, package = _EXTERNAL[config.kind]
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"dask.kind={config.kind!r} needs the {package} package "
                         f"(pip install {package})") from error
    cluster = getattr(module, class_name)(**config.options)
    cluster.scale(config.num_workers)
    return cluster


@contextmanager
def dask_client(config: DaskConfig) -> Iterator[Client]:
    """A client for the configured cluster, closed (and a started cluster stopped) on exit."""
    if config.kind == "address":
        if not config.address:
            raise ValueError("dask.address is required when dask.kind is 'address'")
        with Client(config.address) as client:
            yield client
        return
    if config.kind == "local":
        cluster = local_cluster(config.num_workers, **config.options)
    else:
        cluster = external_cluster(config)
    with cluster, Client(cluster) as client:
        yield client
