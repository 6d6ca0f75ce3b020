"""Ray Train settings shared by rtui's Ray Train programs (``training.train``, ``training.fabric``)."""

from __future__ import annotations

import logging
import os

# Ray Train 2.58 starts a PreemptionWatcher actor beside every worker group with max_restarts=-1
# and the workers' actor handles as constructor arguments. Ray's core worker counts the references
# inside those handles as "constructor arguments in the object store" and logs an ERROR line
# (core_worker.cc) in every job, although a handle cannot be lost like an object. The watcher only
# serves loops that call ray.train.get_preemption_info (rtui's does not) and lets healthy ranks run
# on until a drained node's deadline. Without it a worker killed by a drain still dies "preempted"
# and Ray Train still retries it under FailureConfig.max_preemption_failures (from the latest
# checkpoint, if any). An operator who sets the variable keeps their choice.
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"

# Set by a target whose workers all share one filesystem (the local one): a private dir where they form
# torch's process group through a file instead of a TCP store open to the network (training.rendezvous).
RENDEZVOUS_DIR_ENV = "RTUI_RENDEZVOUS_DIR"


def quiet_ray_train() -> None:
    """Call before the trainer starts: Ray Train propagates this from the driver's environment
    to its controller, where the watcher is created."""
    os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")


def quiet_reports() -> None:
    """Call on each rank before it reports: Ray Train 2.58 logs every ``ray.train.report`` of every rank
    at INFO, as the repr of the whole report (``Reporting training result N: TrainingReport(...)``,
    from its ``_internal.execution.context``, whose logger is named by its file). Shipped to the
    driver, that is several lines of noise per report in the job's log, which rtui's own metric
    lines already say. Its warnings and errors still come through."""
    try:
        from ray.train.v2._internal.execution import context
    except ImportError:  # another Ray layout: its lines are left as they are
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)
