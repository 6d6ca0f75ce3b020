"""A torch.distributed world of one rank (gloo on loopback), for tests of code that needs collectives on CPU
(DCP's save/load, FSDP2, the loss's all-reduce), as bench/gpu_step.py makes one on a GPU."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def world_of_one() -> Iterator[None]:
    """A process group of one rank for the block; one already there (another module's) is used as is."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
