"""Local staging and output paths checked against the Dask workers on other hosts.

A probe file written here and read there tells shared storage (NFS, Lustre: accepted)
from a path that only exists on this host: `StorageNotShared` names the workers that do
not see it, before a reshard writes anything.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

from distributed import Client
from distributed.comm import get_address_host
from distributed.utils import get_ip
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from preprocessing.toolbox.faults import ConfigError


class StorageNotShared(ConfigError, RuntimeError):
    """A local staging or output path that some Dask workers cannot see."""


def require_shared_storage(client: Client, storage: Sequence[str]) -> None:
    """Raise `StorageNotShared` when a local path in `storage` is not visible to every
    worker on another host. A probe file written here and read there tells shared storage
    (NFS, Lustre: accepted) from a path that only exists on this host."""
    local_paths = [_local_path(uri) for uri in storage if _is_local(uri)]
    if not local_paths:
        return
    client.wait_for_workers(1)  # a cluster just scaled up: check its first worker at least
    driver, remote = _workers_on_other_hosts(client)
    for path in local_paths if remote else []:
        blind = _workers_not_seeing(client, path, remote)
        if blind:
            raise StorageNotShared(
                f"{path} is a local path, but Dask workers {', '.join(blind)} on other hosts "
                f"than this driver ({driver}) do not see it: staging and "
                "output need storage every worker shares (a filesystem mounted at the same "
                "path on every host, or an object store such as s3://)"
            )


def _is_local(uri: str) -> bool:
    return isinstance(url_to_fs(uri)[0], LocalFileSystem)


def _local_path(uri: str) -> str:
    return str(Path(url_to_fs(uri)[1]).resolve())


def driver_host(scheduler_address: str) -> str:
    """This host's address on the interface that reaches the scheduler."""
    return str(get_ip(get_address_host(scheduler_address)))


def _workers_on_other_hosts(client: Client) -> tuple[str, list[str]]:
    """This driver's host address, and the workers whose address is on another host."""
    info = client.scheduler_info(n_workers=-1)
    if info["address"].startswith("inproc://"):
        return "inproc", []  # in-process workers: this very process
    driver = driver_host(info["address"])
    return driver, sorted(a for a in info["workers"] if get_address_host(a) != driver)


def _workers_not_seeing(client: Client, path: str, workers: list[str]) -> list[str]:
    token = uuid.uuid4().hex
    probe = Path(path) / f".ballast-storage-probe-{token}"
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text(token)
    try:
        seen = client.run(_read_probe, str(probe), workers=workers)
    finally:
        probe.unlink()
    return sorted(address for address, text in seen.items() if text != token)


def _read_probe(path: str) -> str | None:
    """On a worker: the probe file's text, or None where the path does not exist."""
    try:
        return Path(path).read_text()
    except OSError:
        return None
