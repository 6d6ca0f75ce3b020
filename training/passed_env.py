"""The variables the user passed with ``--job-env``, read from the file the cluster wrote for this job.

They do not travel in the job's ``runtime_env``: Ray's Jobs API returns that to anyone who lists
jobs and its runtime-env agent logs it. The cluster writes them to a file only the user can read
and names the file in ``RTUI_JOB_ENV_FILE``; the driver and every Ray Train worker load it here.
"""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping

JOB_ENV_FILE = "RTUI_JOB_ENV_FILE"


def load_passed_env(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Put the file's variables into ``environ`` (default: this process's); their names, sorted."""
    environ = os.environ if environ is None else environ
    path = environ.get(JOB_ENV_FILE)
    if not path:
        return []
    with open(path, encoding="utf-8") as f:
        values = json.load(f)
    environ.update({str(k): str(v) for k, v in values.items()})
    return sorted(values)
