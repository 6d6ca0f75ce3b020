"""The wire format between the training program and whoever reads its log.

Stdlib only: the training program runs inside the cluster image, and the backend's
telemetry parses these lines from the job log. One line per record, so a record
survives any log pipeline (Ray job logs, pod logs, CloudWatch) intact:

    RTUI_METRIC {"step": 3, "loss": 6.9, "tokens_per_s": 812.4, ...}
    RTUI_SUMMARY {"steps": 20, "tokens_per_s_mean": 790.1, ...}
    RTUI_EVAL {"phase": "before", "step": 0, "loss": 6.93, "perplexity": 1022.7, "tokens": 2048}
    RTUI_FABRIC {"world_size": 2, "results": [{"size_bytes": 1048576, "busbw_gbps": 1.2, ...}], ...}
    RTUI_RESUME {"step": 40, "from": "s3://.../checkpoint_000040", "node": "ip-10-0-1-5.ec2.internal", "ts": ...}
"""

from __future__ import annotations

import json
from typing import Any

METRIC_TAG = "RTUI_METRIC"
SUMMARY_TAG = "RTUI_SUMMARY"
# A held-out evaluation (before the first step, after the last); the summary repeats both.
EVAL_TAG = "RTUI_EVAL"
# The all-reduce sweep of `python -m training.fabric` (read by backend.bench, not by telemetry).
FABRIC_TAG = "RTUI_FABRIC"
# Rank 0 went on from a checkpoint: at the job's start (--resume-from), or after Ray Train restarted
# the worker group (a worker or its node died); ``node`` is where rank 0 now runs (NODE_ENV, else the
# host's name).
RESUME_TAG = "RTUI_RESUME"
NODE_ENV = "RTUI_NODE_NAME"

# Keys every metric record carries. Later versions may add keys, never remove these.
METRIC_KEYS = ("step", "loss", "tokens_per_s", "step_time_s", "world_size", "ts")


def format_record(tag: str, record: dict[str, Any]) -> str:
    return f"{tag} {json.dumps(record, separators=(',', ':'), sort_keys=True)}"


def parse_record(line: str, tags: tuple[str, ...] = (METRIC_TAG, SUMMARY_TAG)) -> tuple[str, dict[str, Any]] | None:
    """Find a tagged record (one of ``tags``) anywhere in a (possibly prefixed) log line.

    Text after the record (a log pipeline's suffix such as Ray's ``[repeated 2x across
    cluster]``) is ignored; a record that is not one whole JSON object is not a record.
    """
    for tag in tags:
        idx = line.find(tag + " {")
        if idx >= 0:
            try:
                value, _end = _DECODER.raw_decode(line, idx + len(tag) + 1)
            except ValueError:
                return None
            return (tag, value) if isinstance(value, dict) else None
    return None


_DECODER = json.JSONDecoder()
