"""Checkpoints at any fsspec URI: finding `last.ckpt`, and FSDP2/TP distributed checkpoints.

DDP checkpoints are single files that Lightning writes through fsspec already
(atomically: a transaction on local disk, one object on S3). Sharded models
(FSDP2, tensor parallel) write a distributed checkpoint (DCP): a directory in
which every rank writes its own shards, plus `meta.pt` holding the rest of
Lightning's checkpoint (loops, loader position, callbacks). Lightning's own
DCP code takes local paths only; here the directory goes through torch's
`FsspecWriter`/`FsspecReader`, so `s3://...` works as well as a local path.

A DCP directory is written beside its destination (`<uri>.partial`) and moved
into place when every rank has finished, so a rank killed mid-save leaves the
previous `last.ckpt` whole.

`resolve_checkpoint` turns `"last"` into the URI of the run's `last.ckpt`
itself, rather than leaving it to Lightning, whose search drops the protocol
of remote paths.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch.distributed.checkpoint as dcp
from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from torch import nn
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from training.config import LAST_CHECKPOINT_NAME

LAST_NAME = LAST_CHECKPOINT_NAME
logger = logging.getLogger(__name__)
METADATA_NAME = "meta.pt"  # the name Lightning gives it, so either side can read the other's


def last_checkpoint_uri(checkpoint_uri: str) -> str:
    """Where `last.ckpt` of a checkpoint directory is (the one name of it)."""
    return f"{checkpoint_uri.rstrip('/')}/{LAST_NAME}"


def resolve_checkpoint(ckpt_path: str | None, resume: bool, candidates: list[str]) -> str | None:
    """The checkpoint to start from: an explicit path; when resuming (or `"last"`), the
    first of `candidates` (`TrainConfig.resume_candidates`: the run's own `last.ckpt`
    first) that exists (None, logged, when none does yet: a first attempt, or one that
    failed before its first save); else None."""
    if ckpt_path not in (None, "last"):
        return ckpt_path
    if ckpt_path == "last" or resume:
        for uri in candidates:
            fs, path = url_to_fs(uri)
            if fs.exists(path):
                return uri
        logger.warning(
            "resume asked for, but there is no checkpoint at %s yet: training starts from scratch",
            " or ".join(candidates),
        )
    return None


def save_sharded(
    checkpoint: dict[str, Any], uri: str, is_global_zero: bool, barrier: Callable[[], None]
) -> None:
    """Write Lightning's `checkpoint` as a DCP directory at `uri` (a collective)."""
    fs, path = url_to_fs(uri)
    staging = f"{path}.partial"
    if is_global_zero and fs.exists(staging):
        fs.rm(staging, recursive=True)
    barrier()
    state = {"state_dict": checkpoint.pop("state_dict")}
    for index, optimizer_state in enumerate(checkpoint.pop("optimizer_states", [])):
        state[f"optimizer_{index}"] = optimizer_state
    dcp.save(state, storage_writer=dcp_writer(f"{uri}.partial"))
    if is_global_zero:
        with fs.open(f"{staging}/{METADATA_NAME}", "wb") as handle:
            torch.save(checkpoint, handle)
        if fs.exists(path):
            fs.rm(path, recursive=True)
        move_tree(fs, staging, path)
    barrier()


def dcp_writer(uri: str) -> FsspecWriter:
    """torch's writer for `uri`, fsyncing each file only on local disk.

    An object store's upload is durable once its stream is closed, so fsync means nothing
    there, and torch asks the stream for `fileno()` to do it: s3fs raises
    `UnsupportedOperation`, which torch catches as `io.UnsupportedOperation`, unless `_io`'s
    module state was created anew in the process (then the class raised is another one, the
    save fails, and gathering the error fails to pickle it). Never asking is the fix.
    """
    fs, _ = url_to_fs(uri)
    return FsspecWriter(uri, sync_files=isinstance(fs, LocalFileSystem))


def move_tree(fs: AbstractFileSystem, source: str, target: str) -> None:
    """Move a directory: one rename on local disk; object by object on an object store."""
    if isinstance(fs, LocalFileSystem):
        fs.mv(source, target, recursive=True)
        return
    for name in fs.find(source):
        fs.copy(name, f"{target}{name[len(source) :]}")
    fs.rm(source, recursive=True)


def load_sharded(
    uri: str,
    model: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    strict: bool = True,
    weights_only: bool = True,
) -> dict[str, Any]:
    """Load model and optimizer shards from the DCP directory at `uri` into the sharded
    `model` and `optimizers`; returns the rest of the checkpoint (from `meta.pt`)."""
    fs, path = url_to_fs(uri)
    if not fs.exists(f"{path}/{METADATA_NAME}"):
        raise FileNotFoundError(f"{uri} is not a distributed checkpoint (no {METADATA_NAME})")
    module_state = {"state_dict": get_model_state_dict(model)}
    dcp.load(module_state, storage_reader=FsspecReader(uri))
    model.load_state_dict(module_state["state_dict"], strict=strict)
    for index, optimizer in enumerate(optimizers):
        key = f"optimizer_{index}"
        optimizer_state = {key: get_optimizer_state_dict(model, optimizer)}
        dcp.load(optimizer_state, storage_reader=FsspecReader(uri))
        options = StateDictOptions(cpu_offload=True)
        set_optimizer_state_dict(model, optimizer, optimizer_state[key], options=options)
    with fs.open(f"{path}/{METADATA_NAME}", "rb") as handle:
        metadata: dict[str, Any] = torch.load(handle, weights_only=weights_only)
    return metadata


def is_sharded_checkpoint(uri: str) -> bool:
    fs, path = url_to_fs(uri)
    return bool(fs.isdir(path) and fs.exists(f"{path}/{METADATA_NAME}"))


def full_network_state(net: nn.Module, sharded: bool) -> dict[str, torch.Tensor]:
    """The unsharded state dict of `net` (a collective when sharded; then only rank 0
    receives tensors, on the CPU)."""
    if not sharded:
        return {name: value.detach().cpu() for name, value in net.state_dict().items()}
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return cast(dict[str, torch.Tensor], get_model_state_dict(net, options=options))
