"""What Ray Train runs on every rank, named from a module the driver can import at no cost.

Ray Train sends the worker function by reference (the module and the name), so the driver imports
the module that defines it. ``training.loop`` brings FSDP2, DTensor and the model code with it: 0.7 s
of the driver's start on a 2-core machine, for nothing the driver runs. A rank imports it here.
"""

from __future__ import annotations

from typing import Any


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's entry on every rank: ``config`` is ``TrainConfig.as_dict()``."""
    from training.loop import train_loop_per_worker as run
    from training.raytrain import quiet_reports

    quiet_reports()
    run(config)
