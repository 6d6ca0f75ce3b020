"""Synthetic but realistic NCCL logs for tests and the parser benchmark.

Shapes follow the real logs in shared/nccl_logs: per-rank init chatter (plugin probing,
OFI setup, topology, channel setup) from every rank of a multi-node job, interleaved with
Ray-prefixed application output and the training program's metric lines.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

HOSTS = ("ip-10-0-1-11", "ip-10-0-1-12", "ip-10-0-1-13", "ip-10-0-1-14")


def rank_init_lines(host: str, pid: int, dev: int, rank: int, n_ranks: int, n_nodes: int, *,
                    net: str = "Libfabric", provider: str = "efa", gdr: bool = True,
                    version: str = "2.27.3+cuda12.9", channels: int = 4, comm: str = "0x55920ac18960") -> list[str]:
    """One rank's NCCL INFO lines for one communicator init, modern (2.2x) format."""
    p = f"{host}:{pid}:{pid + 400} [{dev}] NCCL INFO "
    suffix = "/GDRDMA" if gdr else ""
    lines = [
        p + "cudaDriverVersion 12080",
        p + f"NCCL version {version}",
        p + "NET/Plugin: Plugin name set by env to libnccl-net.so",
        p + f"NET/Plugin: Loaded net plugin {net} (v10)",
        *(p + f"NET/Plugin: Failed to find ncclCollNetPlugin_v{v} symbol." for v in (10, 9, 8, 7, 6)),
        p + "NET/OFI Initializing aws-ofi-nccl 1.16.2",
        p + "NET/OFI Using Libfabric version 2.1",
        p + "NET/OFI Configuring AWS-specific options",
        p + "NET/OFI Setting provider_filter to efa",
        p + "NET/OFI Internode latency set at 75.0 us",
        p + f"NET/OFI Selected provider is {provider}, fabric is {provider} (found 4 nics)",
        *(p + f"NET/OFI NIC group {i} device #0 0000:9{i}:00.0" for i in range(4)),
        *(p + f"NET/OFI GUID for dev[{i}]: 00000000000000000a000b0e0000000{i}" for i in range(4)),
        p + f"Initialized NET plugin {net}",
        p + f"Assigned NET plugin {net} to comm",
        p + f"Using network {net}",
        p + "DMA-BUF is available on GPU device 0",
        p + f"ncclCommInitRankConfig comm {comm} rank {rank} nranks {n_ranks} cudaDev {dev} "
            "nvmlDev 0 busId 9e000 commId 0x7dcff2626d08b830 - Init START",
        p + "Bootstrap timings total 0.177358 (create 0.000102, send 0.000184, recv 0.176257)",
        p + f"Setting affinity for GPU {dev} to 0-47,96-143",
        p + f"comm {comm} rank {rank} nRanks {n_ranks} nNodes {n_nodes} localRanks "
            f"{n_ranks // n_nodes} localRank {dev} MNNVL 0",
        *(p + f"Channel {c:02d}/08 :    0   7   6   5   4   3   2   1   8  15  14  13  12  11  10   9"
          for c in range(8)),
        p + "Trees [0] 1/8/-1->0->-1 [1] 1/-1/-1->0->7 [2] 1/-1/-1->0->7 [3] 1/-1/-1->0->7",
        p + "P2P Chunksize set to 131072",
        p + "Check P2P Type isAllDirectP2p 0 directMode 0",
        p + f"[Proxy Service] Device {dev} CPU core 18",
        p + "TUNER/Plugin: Using tuner plugin nccl_ofi_tuner",
        p + "NET/OFI NCCL_OFI_TUNER is not available for platform : p5.48xlarge, Fall back to NCCL's tuner",
        p + "threadThresholds 8/8/64 | 32/8/64 | 512 | 512",
        p + "2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer",
    ]
    peer = (rank + n_ranks // n_nodes) % n_ranks
    for c in range(channels):
        lines.append(p + f"Channel {c:02d}/0 : {rank}[{dev}] -> {(rank + 1) % n_ranks}[{(dev + 1) % 8}] "
                         "via P2P/CUMEM/read")
        lines.append(p + f"Channel {c:02d}/0 : {peer}[{dev}] -> {rank}[{dev}] [receive] "
                         f"via NET/{net}/{c % 4}{suffix}")
        lines.append(p + f"Channel {c:02d}/0 : {rank}[{dev}] -> {peer}[{dev}] [send] "
                         f"via NET/{net}/{c % 4}{suffix}")
    lines += [
        p + "Connected all rings, use ring PXN 0 GDR 1",
        p + "Connected all trees",
        p + f"ncclCommInitRankConfig comm {comm} rank {rank} nranks {n_ranks} cudaDev {dev} "
            "nvmlDev 0 busId 9e000 commId 0x7dcff2626d08b830 - Init COMPLETE",
    ]
    return lines


_NOISE = (
    "Map: 100%|##########| 36718/36718 [00:01<00:00, 18814.36 examples/s]",
    "[rank{r}]:W0126 07:53:00.671000 194 site-packages/torch/utils/cpp_extension.py:2425] "
    "TORCH_CUDA_ARCH_LIST is not set, all archs for visible cards are included for compilation.",
    "INFO 2026-01-26 07:53:01,123 train_loop_utils.py:412 -- Moving model to device: cuda:{r}",
    "/usr/local/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py:4807: UserWarning: "
    "No device id is provided via `init_process_group` or `barrier `.",
    "step {s}: grad_norm=0.91 lr=2.0e-05 mem_alloc=11.2GB mem_reserved=13.0GB",
    "Checkpoint saved to /mnt/ckpt/step_{s} in 2.31s",
)


def training_log(n_lines: int, *, n_nodes: int = 2, ranks_per_node: int = 8, nccl_share: float = 0.05,
                 metric_share: float = 0.005, seed: int = 7, gdr: bool = True) -> Iterator[str]:
    """``n_lines`` lines of a multi-node run as the Ray job log shows it (no newlines)."""
    rng = random.Random(seed)
    n_ranks = n_nodes * ranks_per_node
    inits: list[list[str]] = []
    for rank in range(n_ranks):
        host, dev = HOSTS[rank // ranks_per_node % len(HOSTS)], rank % ranks_per_node
        inits.append(rank_init_lines(host, 1000 + rank, dev, rank, n_ranks, n_nodes, gdr=gdr))
    ray_prefix = [f"\x1b[36m(RayTrainWorker pid={1000 + r}, ip=10.0.1.{11 + r // ranks_per_node})\x1b[0m "
                  for r in range(n_ranks)]
    cursors = [0] * n_ranks
    step = 0
    for i in range(n_lines):
        roll = rng.random()
        rank = rng.randrange(n_ranks)
        if roll < nccl_share:
            block = inits[rank]
            line = block[cursors[rank] % len(block)]
            cursors[rank] += 1
            yield ray_prefix[rank] + line
        elif roll < nccl_share + metric_share:
            step += 1
            record = {"step": step, "loss": round(6.0 - step * 1e-4, 5), "tokens_per_s": 812.4,
                      "step_time_s": 1.93, "world_size": n_ranks, "ts": 1769413976.0 + i}
            yield ray_prefix[0] + "RTUI_METRIC " + json.dumps(record, separators=(",", ":"), sort_keys=True)
        else:
            yield ray_prefix[rank] + _NOISE[i % len(_NOISE)].format(r=rank, s=step)


# What the training program prints per logged step (training.metrics.metric_record), rounded alike.
def _metric_line(step: int, ts: float, n_ranks: int) -> str:
    step_time = 1.93 + (step % 7) * 0.01
    record = {
        "step": step, "loss": round(6.0 - step * 1e-4, 5), "tokens_per_s": round(131072 / step_time, 2),
        "tokens_per_s_per_worker": round(131072 / step_time / n_ranks, 2), "step_time_s": round(step_time, 5),
        "world_size": n_ranks, "ts": round(ts, 3), "params": 1543714304, "tokens_per_step": 131072,
        "micro_batch": 2, "seq_len": 512, "grad_accum": 8, "data_wait_s": 0.00121, "fwd_bwd_s": 1.61234,
        "grad_sync_s": 0.20111, "optimizer_s": 0.08123, "loss_sync_wait_s": 0.00042, "comm_wait_s": 0.20153,
        "compute_s": 1.72714, "peak_mem_gib": 17.2345, "peak_mem_kind": "cuda", "mfu": 0.3121,
        "device": "NVIDIA L4", "lr": 2e-05, "grad_norm": 0.91234,
    }
    return "RTUI_METRIC " + json.dumps(record, separators=(",", ":"), sort_keys=True)


def run_log(n_lines: int, *, n_nodes: int = 2, ranks_per_node: int = 8, communicators: int = 2,
            restarts: int = 1, channels: int = 8, metric_every: int = 200, seed: int = 7) -> Iterator[str]:
    """``n_lines`` lines of one real multi-node run, in the order its Ray job log has them.

    Every rank prints its NCCL INFO init once per communicator (``communicators`` at the
    start, the same again after each of ``restarts`` resumes from a checkpoint), the ranks'
    lines interleaved as they arrive; the rest is the workers' own output, with rank 0's
    metric line every ``metric_every`` lines. NCCL INFO density is what that makes of a log
    of this length, not a chosen share: see ``nccl_lines_in_run``.
    """
    rng = random.Random(seed)
    n_ranks = n_nodes * ranks_per_node
    prefixes = [f"\x1b[36m(RayTrainWorker pid={1000 + r}, ip=10.0.1.{11 + r // ranks_per_node})\x1b[0m "
                for r in range(n_ranks)]

    def init_burst(generation: int) -> list[str]:
        queues = []
        for rank in range(n_ranks):
            host, dev = HOSTS[rank // ranks_per_node % len(HOSTS)], rank % ranks_per_node
            pid = 1000 + rank + 100 * generation
            for c in range(communicators):
                queues.append([prefixes[rank] + line for line in rank_init_lines(
                    host, pid, dev, rank, n_ranks, n_nodes, channels=channels, comm=f"0x5592{generation}{c:07x}")])
        burst: list[str] = []
        while queues:  # ranks print concurrently: take the next line of a random one
            queue = queues[rng.randrange(len(queues))]
            burst.append(queue.pop(0))
            if not queue:
                queues.remove(queue)
        return burst

    restart_at = {n_lines * (k + 1) // (restarts + 1) for k in range(restarts)}
    pending = init_burst(0)[::-1]  # popped from the end
    generation = step = 0
    for i in range(n_lines):
        if i in restart_at:
            generation += 1
            pending += init_burst(generation)[::-1]
        if pending:
            yield pending.pop()
        elif i % metric_every == 0:
            step += 1
            yield prefixes[0] + _metric_line(step, 1769413976.0 + i * 0.01, n_ranks)
        else:
            rank = rng.randrange(n_ranks)
            yield prefixes[rank] + _NOISE[i % len(_NOISE)].format(r=rank, s=step)


def nccl_lines_in_run(*, n_nodes: int = 2, ranks_per_node: int = 8, communicators: int = 2, restarts: int = 1,
                      channels: int = 8) -> int:
    """How many NCCL INFO lines ``run_log`` with these settings holds, whatever its length."""
    n_ranks = n_nodes * ranks_per_node
    per_rank = len(rank_init_lines("h", 1, 0, 0, n_ranks, n_nodes, channels=channels))
    return per_rank * n_ranks * communicators * (restarts + 1)
