"""FSDP2 sharding (full or hybrid), activation checkpointing, torch.compile and the optimizer."""

from __future__ import annotations

from typing import Any


def mesh_shape(mode: str, world: int, shard_size: int) -> tuple[int, int]:
    """(replicate, shard) for ``--shard``: full shards over every rank; hybrid shards within a group
    of ``shard_size`` consecutive ranks (one node's workers) and replicates across groups."""
    if mode == "full":
        return 1, world
    if shard_size < 1 or world % shard_size:
        raise ValueError(f"--shard hybrid needs a shard size that divides the {world} workers, got {shard_size}")
    return world // shard_size, shard_size


def build_mesh(device_type: str, mode: str, world: int, shard_size: int) -> Any:
    """A 1-D mesh for full sharding, a 2-D ("replicate", "shard") mesh for HSDP.

    init_device_mesh lays ranks out row-major, so a shard group is ``shard_size`` consecutive ranks;
    Ray Train numbers the workers of one node consecutively, so with shard_size = workers per node
    the all-gathers and reduce-scatters stay inside a node and only the gradient all-reduce over
    the "replicate" dimension crosses the network.
    """
    from torch.distributed.device_mesh import init_device_mesh

    replicate, shard = mesh_shape(mode, world, shard_size)
    if mode == "full":
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (replicate, shard), mesh_dim_names=("replicate", "shard"))


def shard_groups_span_nodes(node_of_rank: list[str], shard_size: int) -> list[int]:
    """First rank of every shard group whose ranks are not all on one node (HSDP then sends its
    all-gathers over the network, which is what hybrid sharding is meant to avoid)."""
    bad = []
    for start in range(0, len(node_of_rank), shard_size):
        if len(set(node_of_rank[start:start + shard_size])) > 1:
            bad.append(start)
    return bad


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant, which composes with
    FSDP2's hooks) instead of storing them: ~1/3 more compute for far less activation memory."""
    model.config.use_cache = False
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def shard_model(model: Any, precision: str, reshard_after_forward: bool = True, mesh: Any = None,
                compile_layers: bool = False, reduce_dtype: str = "fp32") -> Any:
    """FSDP2: shard each decoder layer, then the root (so layers gather one at a time).

    bf16 computes in bf16 and by default reduces gradients in fp32 (summing many ranks' bf16
    gradients loses precision); ``reduce_dtype="bf16"`` halves the gradient bytes on the wire, which
    is what a network-bound HSDP step pays for. The sharded parameters keep the dtype the model
    has when it is sharded: the master weights (and so the gradients and AdamW's states) are fp32
    only if the model was loaded in fp32 (``training.step.load_pretrained`` does).

    The root (embeddings, final norm, lm_head) is never resharded after forward: backward starts
    with the lm_head, right after the forward ended with it, so freeing it would only make FSDP
    all-gather the same (for Qwen2.5, tied 233M-parameter) embedding again at once.
    """
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    reduce = torch.bfloat16 if reduce_dtype == "bf16" else torch.float32
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)
          if precision == "bf16" else MixedPrecisionPolicy())
    for layer in model.model.layers:
        if compile_layers:
            # Per-layer compile before sharding: the layers are identical, so one graph is reused,
            # and FSDP's collectives stay outside the compiled region (no graph breaks inside it).
            layer.compile()
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    return model


def build_optimizer(params: Any, lr: float, impl: str, device_type: str, weight_decay: float) -> Any:
    """AdamW with the fused kernel where it exists (one kernel for all params), foreach otherwise."""
    import torch

    if impl == "auto":
        impl = "fused" if device_type == "cuda" else "foreach"
    kwargs: dict[str, Any] = {"lr": lr, "weight_decay": weight_decay, "betas": (0.9, 0.95)}
    if impl == "fused":
        kwargs["fused"] = True
    elif impl == "foreach":
        kwargs["foreach"] = True
    else:
        kwargs["foreach"] = False
    return torch.optim.AdamW(params, **kwargs)
