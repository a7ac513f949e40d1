"""Apply FSDP2 and tensor parallelism to a model from outside it (torchtitan's way).

The model files hold no parallelism. For `fsdp` and `tp`, train.py binds
`parallelize` as the module's `configure_model` hook (`bind_parallelism`),
which Lightning's `ModelParallelStrategy` calls once the device mesh exists:

- `tp` (the transformer only): in every block the attention projections q, k,
  v and the first feed-forward layer are split by output columns and `wo` and
  the second feed-forward layer by input rows (one all-reduce per attention
  and per feed-forward); embeddings are split by vocabulary rows; norms and the
  head are replicated DTensors, so every parameter is a DTensor of one mesh.
- then FSDP2 over the data-parallel mesh when it has more than one rank:
  `fully_shard` per block (per layer of an MLP), then the whole network.

A user model that overrides `configure_model` keeps its own parallelism.
"""

from __future__ import annotations

from functools import partial
from typing import Any, cast

import lightning
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from training.models.transformer import Block, TokenTransformer

BLOCK_PLAN: dict[str, ParallelStyle] = {
    "attention.wq": ColwiseParallel(),
    "attention.wk": ColwiseParallel(),
    "attention.wv": ColwiseParallel(),
    "attention.wo": RowwiseParallel(),
    "feed_forward.w1": ColwiseParallel(),
    "feed_forward.w2": RowwiseParallel(),
}
EMBEDDING = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())


def bind_parallelism(module: lightning.LightningModule, tensor_parallel: bool) -> None:
    """Make `parallelize` the module's `configure_model` hook, unless it has its own."""
    if not is_overridden("configure_model", module):
        module.configure_model = partial(parallelize, module, tensor_parallel)  # type: ignore[method-assign]


def parallelize(module: lightning.LightningModule, tensor_parallel: bool) -> None:
    """Shard `module.net` over the strategy's mesh: tensor parallel first, then FSDP2."""
    net = network_of(module)
    if already_parallel(net):
        return  # configure_model runs again on a second fit of the same module
    mesh = module.device_mesh
    if mesh is None:
        raise RuntimeError("parallelize runs in configure_model, once the device mesh exists")
    if tensor_parallel:
        apply_tensor_parallel(net, mesh["tensor_parallel"])
    if mesh["data_parallel"].size() > 1 or not tensor_parallel:
        apply_fsdp(net, mesh["data_parallel"])


def network_of(module: lightning.LightningModule) -> nn.Module:
    net = getattr(module, "net", None)
    if not isinstance(net, nn.Module):
        raise TypeError(
            f"{type(module).__name__} has no `net` to shard: expose the network as `self.net` "
            "or override `configure_model` to apply parallelism yourself"
        )
    return net


def already_parallel(net: nn.Module) -> bool:
    return any(isinstance(param, DTensor) for param in net.parameters())


def shard_units(net: nn.Module) -> list[nn.Module]:
    """What FSDP2 shards one by one: the transformer's blocks, else each child with weights."""
    blocks = getattr(net, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        return list(blocks)
    return [child for child in net.children() if any(True for _ in child.parameters())]


def apply_fsdp(net: nn.Module, mesh: DeviceMesh) -> None:
    """`fully_shard` per unit, then the whole network (parameters left over)."""
    for unit in shard_units(net):
        fully_shard(unit, mesh=mesh)
    fully_shard(net, mesh=mesh)


def apply_tensor_parallel(net: nn.Module, mesh: DeviceMesh) -> None:
    """The tensor-parallel plan above; refused for networks without transformer blocks."""
    if not isinstance(net, TokenTransformer):
        raise TypeError(
            f"strategy tp needs the built-in transformer, not {type(net).__name__}; "
            "a user model can override `configure_model` with its own plan"
        )
    for module in net.blocks:
        block = cast(Block, module)
        parallelize_module(block, mesh, BLOCK_PLAN)
        replicate(block.attention_norm, mesh)
        replicate(block.ffn_norm, mesh)
    parallelize_module(net.tok_embeddings, mesh, EMBEDDING)
    parallelize_module(net.pos_embeddings, mesh, EMBEDDING)
    replicate(net.norm, mesh)
    replicate(net.head, mesh)


def replicate(module: nn.Module, mesh: DeviceMesh) -> None:
    """Parameters as replicated DTensors; plain tensors in and out."""
    distribute_module(
        module,
        mesh,
        input_fn=replicated_inputs,  # type: ignore[arg-type]
        output_fn=local_outputs,
    )


def replicated_inputs(module: nn.Module, inputs: Any, mesh: DeviceMesh) -> tuple[Any, ...]:
    return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False) for x in inputs)


def local_outputs(module: nn.Module, outputs: Any, mesh: DeviceMesh) -> Any:
    return outputs.to_local() if isinstance(outputs, DTensor) else outputs
