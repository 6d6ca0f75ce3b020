"""The per-worker training loop Ray Train runs on every rank."""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from typing import Any

from training import checkpoint as ckpt
from training.checkpoint_interval import AutoCheckpoints, estimated_checkpoint_s
from training.config import TrainConfig
from training.data import ShardBatches, SyntheticTokens, trimming_collate
from training.devices import (
    detect_peak,
    memory_budget_bytes,
    peak_memory_bytes,
    reset_peak_memory,
    training_flops_per_token,
)
from training.evaluate import equal_batch_count, eval_stream, evaluate, sequences_per_rank, take_batches
from training.export import ExportInfo, export_model, reference_logits
from training.metrics import (
    RunFacts,
    RunSummary,
    eval_record,
    metric_record,
    model_record,
    print_eval,
    print_metric,
    print_summary,
)
from training.passed_env import load_passed_env
from training.protocol import NODE_ENV, RESUME_TAG, format_record
from training.sharding import build_mesh, build_optimizer, param_groups, shard_groups_span_nodes
from training.step import for_training, load_pretrained, norm_value, prepare_model, train_step
from training.stepplan import FitCheck, ModelShape, StepPlan, plan_step
from training.transport_guard import TransportMismatch

REPORT_EVERY_S = 5.0  # ray.train.report is slow (the controller polls every ~2 s): report rarely


def _guard_transport(cfg: TrainConfig) -> Any:
    """Before any collective: make this rank's NCCL write its INFO log where the guard reads it."""
    if cfg.require_transport == "any":
        return None
    from training.transport_guard import capture_nccl_debug

    if cfg.nccl_dir is None:
        raise ValueError("--require-transport needs the driver to set nccl_dir before the workers start")
    return capture_nccl_debug(cfg.nccl_dir)


def enforce_transport(cfg: TrainConfig, nccl_dir: Any) -> None:
    from training.transport_guard import enforce_transport as enforce
    from training.transport_guard import job_nodes

    try:
        verdict = enforce(cfg.require_transport, nccl_dir, echo=sys.stdout, nodes=job_nodes())
    except SystemExit as exc:  # a Ray worker must fail with a message, not exit
        raise TransportMismatch(str(exc.code)) from None
    print(f"rtui-train: NCCL transport {verdict.transport} satisfies --require-transport "
          f"{cfg.require_transport}", flush=True)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then constant, or cosine or linear decay to 10 % at the last step — a pure
    function of the step, so a resumed run needs no scheduler state."""
    base, warmup, total = cfg.lr, cfg.warmup_steps, cfg.steps
    if warmup and step <= warmup:
        return base * step / warmup
    if cfg.lr_schedule != "constant" and total > warmup:
        progress = min(1.0, (step - warmup) / (total - warmup))
        falling = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.lr_schedule == "cosine" else 1 - progress
        return base * (0.1 + 0.9 * falling)
    return base


def build_model(cfg: TrainConfig) -> Any:
    """Qwen2 from the hub or a local directory (fp32 master weights, training mode), or a tiny
    random one built from a config (no download)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if cfg.model_id:
        return load_pretrained(cfg.model_id, revision=cfg.model_revision)
    heads = cfg.tiny_heads
    config = Qwen2Config(
        vocab_size=cfg.tiny_vocab_size, hidden_size=cfg.tiny_hidden_size,
        intermediate_size=cfg.tiny_hidden_size * 4, num_hidden_layers=cfg.tiny_layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=max(512, cfg.seq_len), tie_word_embeddings=False, use_cache=False,
    )
    return for_training(Qwen2ForCausalLM(config))


def prepare_for_training(model: Any, cfg: TrainConfig, device: Any, mesh: Any, reshard: bool) -> tuple[Any, Any]:
    """The built model sharded as ``cfg`` asks, and its AdamW; the device's peak memory starts over."""
    model = prepare_model(model, device=device, mesh=mesh, precision=cfg.precision, reduce_dtype=cfg.reduce_dtype,
                          reshard_after_forward=reshard, activation_checkpointing=cfg.activation_checkpointing,
                          compile_layers=cfg.compile)
    optimizer = build_optimizer(param_groups(model, cfg.weight_decay), cfg.lr, cfg.optimizer, device.type,
                                cfg.weight_decay)
    reset_peak_memory(device)  # the unsharded model sat on the device for a moment: not the run's peak
    return model, optimizer


def syncs_every_micro_step(cfg: TrainConfig) -> bool:
    """FSDP2 accumulates the gradients of micro-steps that skip the reduce-scatter in its reduce dtype
    (``FSDPParam.to_accumulated_grad_if_needed`` upcasts only to the reduce dtype): with a bf16 reduce
    that would sum gradients in bf16. Then every micro-step reduces and the sharded fp32 gradients
    accumulate instead (more gradient traffic, fp32 sums)."""
    return cfg.precision == "bf16" and cfg.reduce_dtype == "bf16"


def _plan(cfg: TrainConfig, model: Any, world: int, shard_size: int, budget: tuple[int | None, str],
          reshard: bool) -> StepPlan:
    c = model.config
    shape = ModelShape(sum(p.numel() for p in model.parameters()), c.num_hidden_layers, c.hidden_size,
                       c.intermediate_size, c.vocab_size)
    fits = FitCheck(
        shape, seq_len=cfg.seq_len, shard_size=shard_size, compute_bytes=2 if cfg.precision == "bf16" else 4,
        # Unsharded gradients kept between micro-steps: fp32 (FSDP2 upcasts them to the fp32 reduce
        # dtype), or none when every micro-step reduces (syncs_every_micro_step).
        grad_accum_bytes=0 if syncs_every_micro_step(cfg) else 4,
        reshard_after_forward=reshard, activation_checkpointing=cfg.activation_checkpointing,
        budget_bytes=budget[0], budget_source=budget[1],
        sequences_per_rank=cfg.tokens_per_step // (cfg.seq_len * world) if cfg.tokens_per_step else None,
    ) if cfg.memory_check else None
    return plan_step(tokens_per_step=cfg.tokens_per_step, seq_len=cfg.seq_len, world=world,
                     micro_batch=cfg.batch_size, fits=fits)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's entry on every rank: ``config`` is ``TrainConfig.as_dict()``."""
    load_passed_env()  # a worker is its own process: the --job-env values come from the cluster's file
    run_worker(TrainConfig.from_dict(config))


def run_worker(cfg: TrainConfig) -> None:
    import ray
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist
    from ray.train import CheckpointUploadMode

    nccl_dir = _guard_transport(cfg)  # NCCL creates communicators lazily: this is early enough
    ctx = ray.train.get_context()
    rank, world, local_world = ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_world_size()
    device = ray.train.torch.get_device()
    budget = memory_budget_bytes(device, local_world)  # before the model takes any of it
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    reshard = cfg.reshard_after_forward == "yes" or (cfg.reshard_after_forward == "auto" and device.type == "cuda")
    shard_size = world if cfg.shard == "full" else (cfg.shard_size or local_world)
    plan = _plan(cfg, model, world, shard_size, budget, reshard)
    n_params = sum(p.numel() for p in model.parameters())
    mesh = build_mesh(device.type, cfg.shard, world, shard_size)
    if cfg.shard == "hybrid":
        nodes: list[Any] = [None] * world
        dist.all_gather_object(nodes, ray.get_runtime_context().get_node_id() or socket.gethostname())
        spanning = shard_groups_span_nodes([str(n) for n in nodes], shard_size)
        if spanning and rank == 0:
            print(f"rtui-train: warning: hybrid shard groups starting at ranks {spanning} span nodes; their "
                  "all-gathers cross the network (set --shard-size to the workers per node)", flush=True)
    model, optimizer = prepare_for_training(model, cfg, device, mesh, reshard)
    if rank == 0:
        mesh_desc = "x".join(str(d) for d in mesh.shape) + f" {mesh.mesh_dim_names}"
        memory = f"; estimated peak {plan.memory.describe()} per rank" if plan.memory else ""
        print(f"rtui-train: step = micro-batch {plan.micro_batch} x seq {plan.seq_len} x {world} ranks x accum "
              f"{plan.grad_accum} = {plan.tokens_per_step} tokens; mesh {mesh_desc}{memory}", flush=True)

    if cfg.synthetic_data:
        data: SyntheticTokens | ShardBatches = SyntheticTokens(
            cfg.data, model.config.vocab_size, plan.micro_batch, plan.seq_len, cfg.seed, rank)
    else:
        data = ShardBatches(ray.train.get_dataset_shard("train"), plan.micro_batch, device)

    start_step, tokens_seen = 0, 0
    # After a worker died (--max-failures) Ray Train restarts the group: this run's newest complete
    # checkpoint wins over --resume-from. Rank 0 chooses (a scan of the store), every rank loads it.
    storage = ray.train.get_context().get_storage()
    run_dir = ckpt.storage_uri(storage.storage_filesystem, storage.experiment_fs_path)
    choice: list[str | None] = [ckpt.restart_point(run_dir, cfg.resume_path) if rank == 0 else None]
    dist.broadcast_object_list(choice, src=0)
    resume = choice[0]
    if resume:
        restored = ckpt.load(resume, model, optimizer, rank)
        print(f"rtui-train: rank {rank} read {restored.bytes_read / 2**20:.1f} MiB of the checkpoint", flush=True)
        start_step, tokens_seen = restored.meta.step, restored.meta.tokens_seen
        if restored.rank_state is not None and restored.meta.world_size == world:
            data.load_state(restored.rank_state["data"])
            torch.set_rng_state(restored.rank_state["torch_rng"])
        elif rank == 0:
            print("rtui-train: warning: checkpoint from a different world size; data order restarts", flush=True)
        if rank == 0:
            node = os.environ.get(NODE_ENV) or socket.gethostname()
            print(f"rtui-train: resumed from {resume} at step {start_step} on {node}", flush=True)
            print(format_record(RESUME_TAG, {"step": start_step, "from": resume, "node": node, "ts": time.time()}),
                  flush=True)

    eval_batches = held_out_batches(cfg, model, plan, rank, world, device)
    before = evaluate_and_print(model, eval_batches, device, rank, step=start_step, phase="before")
    reset_peak_memory(device)  # the evaluation's forward is not the training step's peak

    peak = detect_peak(device)
    c = model.config
    facts = RunFacts(n_params, world, plan.micro_batch, plan.seq_len, plan.grad_accum, peak.name, peak.flops,
                     peak.reason, str(dist.get_backend()) if dist.is_initialized() else "?",
                     training_flops_per_token(n_params, c.num_hidden_layers, c.hidden_size, plan.seq_len))
    sync_every_micro_step = syncs_every_micro_step(cfg)
    # --checkpoint-every auto: rank 0 decides from what it measures, every rank follows its vote.
    pacer = AutoCheckpoints(
        interruptions_per_hour=cfg.interruptions_per_hour or 0.0, start_step=start_step, last_step=cfg.steps,
        first_checkpoint_s=estimated_checkpoint_s(n_params, max(1, world // max(1, local_world))),
    ) if cfg.checkpoint_every == "auto" and rank == 0 else None
    summary = RunSummary(start_step)
    last_report = time.monotonic()
    for step in range(start_step + 1, cfg.steps + 1):
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        start = time.perf_counter()
        out = train_step(model, optimizer, data.next_batch, device=device, grad_accum=plan.grad_accum,
                         max_grad_norm=cfg.max_grad_norm, reshard_after_forward=reshard,
                         sync_every_micro_step=sync_every_micro_step)
        loss_sum, t = out.loss_sum, out.timings
        # One all-reduce carries the loss and rank 0's "report now" and "checkpoint now" votes, so every
        # rank makes the same ray.train.report decision (each rank's own clock could disagree and hang
        # the group; a report with a checkpoint is collective).
        now = time.monotonic()
        vote = 1.0 if rank == 0 and now - last_report >= REPORT_EVERY_S else 0.0
        checkpoint_vote = 1.0 if pacer is not None and pacer.due(step) else 0.0
        packed = torch.stack([loss_sum, torch.tensor(vote, device=device),
                              torch.tensor(checkpoint_vote, device=device)])
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        loss_value, report_now = float(packed[0]) / world, float(packed[1]) > 0  # the step's one sync
        auto_checkpoint_now = float(packed[2]) > 0
        step_time = time.perf_counter() - start
        if pacer is not None:
            pacer.stepped(step_time)
        out.finish()
        grad_norm = norm_value(out.grad_norm)
        # What the device timeline does not account for: the loss all-reduce, waiting for the
        # slowest rank, and host gaps the queue did not hide.
        t.loss_sync_wait_s = max(0.0, step_time - t.data_wait_s - t.fwd_bwd_s - t.optimizer_s)
        tokens_seen += plan.tokens_per_step
        if step == start_step + 1 and nccl_dir is not None:
            enforce_transport(cfg, nccl_dir)
        peak_bytes, mem_kind = peak_memory_bytes(device)
        record = metric_record(facts, step=step, loss=loss_value, step_time_s=step_time, timings=t,
                               peak_mem_bytes=peak_bytes, mem_kind=mem_kind, lr=lr, grad_norm=grad_norm)
        summary.add(record, step_time, peak_bytes)
        if rank == 0:
            print_metric(record)
        every = cfg.checkpoint_every
        metrics = {"step": step, "loss": loss_value, "tokens_seen": tokens_seen}
        if every == "auto":
            checkpoint_now = auto_checkpoint_now or step == cfg.steps
        else:
            checkpoint_now = bool(every) and (step % every == 0 or step == cfg.steps)
        if checkpoint_now:
            checkpoint_start = time.perf_counter()
            meta = ckpt.CheckpointMeta(step=step, world_size=world, tokens_seen=tokens_seen, data=cfg.data,
                                       ts=time.time())
            rank_state = {"data": data.state(), "torch_rng": torch.get_rng_state()}
            local = ckpt.save_local(model, optimizer, rank, rank_state, meta)
            try:
                # The upload runs on the rank's upload thread while the next steps train; Ray waits for
                # it when this function returns. Each rank's done file, then rank 0's marker, end it.
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(local),
                                 checkpoint_dir_name=ckpt.checkpoint_dir_name(step),
                                 checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                                 checkpoint_upload_fn=ckpt.Uploader(storage, rank, meta, local),
                                 delete_local_checkpoint_after_upload=False)
            except BaseException:
                ckpt.discard_local(local)  # no upload was queued
                raise
            last_report = time.monotonic()
            if pacer is not None:  # the time training stood still for it (the upload goes on behind)
                pacer.checkpointed(step, time.perf_counter() - checkpoint_start)
        elif report_now or step == cfg.steps:
            ray.train.report(metrics)
            last_report = now
        if cfg.export_every and step % cfg.export_every == 0 and step != cfg.steps:
            export(model, cfg, device, rank, step, final=False, evaluation={"before": before})
    after = evaluate_and_print(model, eval_batches, device, rank, step=cfg.steps, phase="after")
    evaluation = {"before": before, "after": after} if before else {}
    info = export(model, cfg, device, rank, cfg.steps, final=True, evaluation=evaluation)
    if rank == 0:
        record = summary.record(facts, cfg.steps)
        if evaluation:
            record.update(eval_record(evaluation))
        if info is not None:
            record["model"] = model_record(info)
        print_summary(record)


def held_out_batches(cfg: TrainConfig, model: Any, plan: StepPlan, rank: int, world: int, device: Any) -> list[Any]:
    """This rank's share of the held-out split, read once and evaluated before and after training."""
    if not cfg.eval_tokens:
        return []
    import ray.train

    # Batches no larger than the evaluation needs: --eval-tokens, not the micro-batch, sets its size.
    batch = min(plan.micro_batch, sequences_per_rank(cfg.eval_tokens, plan.seq_len, world, 1))
    n = sequences_per_rank(cfg.eval_tokens, plan.seq_len, world, batch) // batch
    if cfg.synthetic_data:
        stream = SyntheticTokens(cfg.data, model.config.vocab_size, batch, plan.seq_len, cfg.seed, eval_stream(rank))
        return take_batches(stream.next_batch, n)
    shard = ray.train.get_dataset_shard("eval")
    # Cut after each batch's longest example, as training's are: the same loss for less padding.
    iterator = shard.iter_torch_batches(batch_size=batch, collate_fn=trimming_collate(), device="cpu", drop_last=True)
    batches = [{key: b[key].cpu() for key in ("input_ids", "labels")} for b in take_batches(iterator, n)]
    batches = equal_batch_count(batches, device)
    if not batches and rank == 0:
        print("rtui-train: warning: the held-out split holds no full micro-batch on some rank; no evaluation",
              flush=True)
    return batches


def evaluate_and_print(model: Any, batches: list[Any], device: Any, rank: int, *, step: int,
                       phase: str) -> dict[str, Any]:
    if not batches:
        return {}
    result: dict[str, Any] = {**evaluate(model, batches, device), "step": step, "phase": phase}
    if rank == 0:
        print_eval(result)
    return result


def export(model: Any, cfg: TrainConfig, device: Any, rank: int, step: int, *, final: bool,
           evaluation: dict[str, Any]) -> ExportInfo | None:
    """The Hugging Face model directory under ``cfg.export_root`` (every rank gathers, rank 0 writes)."""
    import torch

    if not cfg.export_root:
        return None
    check = reference_logits(model, device)
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    info = export_model(model, cfg.export_root, rank=rank, step=step, final=final, dtype=dtype,
                        tokenizer=cfg.tokenizer_source, tokenizer_revision=cfg.tokenizer_revision,
                        check=check, evaluation=evaluation)
    if info is not None:
        print(f"rtui-train: model ({'final' if final else f'step {step}'}) written to {info.uri}: "
              f"{len(info.files)} files, {info.bytes:,} bytes in {info.export_s:.1f}s", flush=True)
    return info
