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


class UnsupportedModel(ValueError):
    """The model has no decoder layer list FSDP2 can shard one block at a time; one line."""


def decoder_layers(model: Any) -> Any:
    """The decoder blocks of a transformers causal LM: ``<base model>.layers`` (``model.model.layers``
    for Qwen2/3, Llama, Mistral, Gemma; ``gpt_neox.layers``), found through ``base_model`` (the
    submodule named by the class's ``base_model_prefix``) rather than by family."""
    import torch

    base = getattr(model, "base_model", None)
    layers = getattr(base, "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
        return layers
    raise UnsupportedModel(f"{type(model).__name__} has no decoder layer list (base_model.layers) to shard: "
                           "rtui fine-tunes decoder-only causal LMs such as Qwen2/3, Llama, Mistral or Gemma")


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
    for layer in decoder_layers(model):
        if compile_layers:
            # Per-layer compile before sharding: the layers are identical, so one graph is reused,
            # and FSDP's collectives stay outside the compiled region (no graph breaks inside it).
            layer.compile()
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    return model


def param_groups(model: Any, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW's two groups: weight decay on the weight matrices, none on norms, biases and embeddings.

    Decay pulls a weight toward 0: for an RMSNorm gain (1 at init) that scales the layer's output
    down, for a bias or an embedding row (updated only when its token occurs) it erases what little
    each step teaches. A matrix is a parameter of two or more dimensions that no ``nn.Embedding`` owns
    (a tied lm_head is the embedding: one parameter, not decayed).
    """
    import torch

    embeddings = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    decay: list[Any] = []
    no_decay: list[Any] = []
    for p in model.parameters():  # each parameter once, tied ones included
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 and id(p) not in embeddings else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(params: Any, lr: float, impl: str, device_type: str, weight_decay: float) -> Any:
    """AdamW with the fused kernel where it exists (one kernel for all params), foreach otherwise.
    ``params``: parameters or groups (``param_groups``); a group's own weight_decay wins."""
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
