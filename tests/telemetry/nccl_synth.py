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
                    version: str = "2.27.3+cuda12.9") -> list[str]:
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
        p + f"ncclCommInitRankConfig comm 0x55920ac18960 rank {rank} nranks {n_ranks} cudaDev {dev} "
            "nvmlDev 0 busId 9e000 commId 0x7dcff2626d08b830 - Init START",
        p + "Bootstrap timings total 0.177358 (create 0.000102, send 0.000184, recv 0.176257)",
        p + f"Setting affinity for GPU {dev} to 0-47,96-143",
        p + f"comm 0x55920ac18960 rank {rank} nRanks {n_ranks} nNodes {n_nodes} localRanks "
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
    for c in range(4):
        lines.append(p + f"Channel {c:02d}/0 : {rank}[{dev}] -> {(rank + 1) % n_ranks}[{(dev + 1) % 8}] "
                         "via P2P/CUMEM/read")
        lines.append(p + f"Channel {c:02d}/0 : {peer}[{dev}] -> {rank}[{dev}] [receive] "
                         f"via NET/{net}/{c}{suffix}")
        lines.append(p + f"Channel {c:02d}/0 : {rank}[{dev}] -> {peer}[{dev}] [send] "
                         f"via NET/{net}/{c}{suffix}")
    lines += [
        p + "Connected all rings, use ring PXN 0 GDR 1",
        p + "Connected all trees",
        p + f"ncclCommInitRankConfig comm 0x55920ac18960 rank {rank} nranks {n_ranks} cudaDev {dev} "
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
