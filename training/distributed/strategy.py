"""The Lightning strategy of a job, from its config: DDP with measured comm hooks, or
FSDP2 / tensor parallel through `ModelParallelStrategy`.

- `MeteredDDPStrategy` registers the configured comm hook (training/distributed/comm.py) on
  every device type: Lightning's `DDPStrategy` registers hooks on CUDA only
  (docs/architecture.md M2). Post-local SGD's parameter averaging is metered too.
- `ShardedStrategy` is `ModelParallelStrategy` (FSDP2 on CPU with gloo and on
  CUDA, docs/architecture.md M3) with distributed checkpoints through fsspec
  (training/distributed/checkpoints.py). With tensor parallelism, each rank still reads
  its own batch (the loader shards samples over all ranks); the ranks of a
  tensor-parallel group concatenate their batches, so the group computes on
  all of them at once, every sample is used once, and the global batch is the
  same as DDP's. In validation, samples from other ranks of the group get
  weight 0 after the forward pass, so metrics count every sample once.

Both get a process-group timeout, so a dead peer fails the job instead of
hanging it. `auto` is DDP over several ranks and Lightning's single-device
strategy in one process (no process group); `ddp` is DDP even on one rank.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, Strategy
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState

from training.config import TrainConfig
from training.distributed.checkpoints import is_sharded_checkpoint, load_sharded, save_sharded
from training.distributed.comm import CommMeter, MeteredAverager, build_hook


class MeteredDDPStrategy(DDPStrategy):
    """DDP whose comm hook is registered on any device, with a `CommMeter`."""

    def __init__(self, cfg: TrainConfig, **kwargs: Any) -> None:
        self.meter = CommMeter()
        state, hook = build_hook(cfg.comm, self.meter)
        super().__init__(
            ddp_comm_state=state,
            ddp_comm_hook=hook,
            model_averaging_period=cfg.comm.local_sgd_period,
            bucket_cap_mb=cfg.comm.bucket_cap_mb,
            **kwargs,
        )

    def _register_ddp_hooks(self) -> None:
        if self._ddp_comm_hook is not None and self.model is not None:
            self.model.register_comm_hook(self._ddp_comm_state, self._ddp_comm_hook)  # type: ignore[operator]

    def _enable_model_averaging(self) -> None:
        state = self._ddp_comm_state
        assert isinstance(state, PostLocalSGDState) and self._model_averaging_period is not None
        self._model_averager = MeteredAverager(
            self._model_averaging_period, state.start_localSGD_iter, self.meter
        )


class ShardedStrategy(ModelParallelStrategy):
    """FSDP2 / tensor parallel with fsspec distributed checkpoints and shared TP batches."""

    @property
    def tensor_parallel_size(self) -> int:
        return int(self.device_mesh["tensor_parallel"].size())

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        uri = self.broadcast(str(filepath))
        save_sharded(checkpoint, uri, self.is_global_zero, self.barrier)

    def load_checkpoint(
        self, checkpoint_path: Any, weights_only: bool | None = None
    ) -> dict[str, Any]:
        uri = self.broadcast(str(checkpoint_path))
        weights_only = True  # ballast's own checkpoints: tensors and plain metadata only
        if not is_sharded_checkpoint(uri):
            return super().load_checkpoint(Path(uri), weights_only)
        assert self.model is not None and self.lightning_module is not None
        strict = self.lightning_module.strict_loading
        return load_sharded(uri, self.model, self.optimizers, strict, weights_only)

    def batch_to_device(
        self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0
    ) -> Any:
        batch = super().batch_to_device(batch, device, dataloader_idx)
        if self.tensor_parallel_size == 1 or not isinstance(batch, dict):
            return batch
        return self.share_batch(batch)

    def share_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Concatenate the batches of this tensor-parallel group, in rank order."""
        mesh = self.device_mesh["tensor_parallel"]
        group, position = mesh.get_group(), mesh.get_local_rank()
        shared = {}
        for key, tensor in batch.items():
            parts = [torch.empty_like(tensor) for _ in range(mesh.size())]
            dist.all_gather(parts, tensor.contiguous(), group=group)
            shared[key] = torch.cat(parts)
        module = self.lightning_module
        if "weight" in shared and module is not None and not module.trainer.training:
            own = torch.zeros_like(shared["weight"]).view(mesh.size(), -1)
            own[position] = 1
            shared["weight"] = shared["weight"] * own.view(-1)
        return shared


def build_strategy(cfg: TrainConfig, world_size: int) -> Strategy | str:
    """The strategy `cfg.strategy` names, for `world_size` ranks."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = timedelta(seconds=cfg.process_group_timeout_s)
    if cfg.strategy in ("fsdp", "tp"):
        tensor_parallel = cfg.tensor_parallel_size if cfg.strategy == "tp" else 1
        if world_size % tensor_parallel:
            raise ValueError(
                f"tensor_parallel_size: {tensor_parallel} does not divide the {world_size} ranks"
            )
        return ShardedStrategy(
            data_parallel_size=world_size // tensor_parallel,
            tensor_parallel_size=tensor_parallel,
            process_group_backend=backend,
            timeout=timeout,
        )
    if world_size == 1 and cfg.strategy == "auto":
        return "auto"
    return MeteredDDPStrategy(cfg, process_group_backend=backend, timeout=timeout)
