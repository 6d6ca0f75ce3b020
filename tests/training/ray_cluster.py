"""The Ray the training program's tests submit to: one for the package (tests/training/conftest.py)."""

from __future__ import annotations

from backend.jobspec import CPU_HEALTH_CHECK_INTERVAL_S
from tests.conftest import REPO

# As rtui's CPU job has it (backend.jobspec), the controller's quicker look at its workers included.
WORKER_ENV = {"PYTHONPATH": str(REPO), "RAY_TRAIN_ENABLE_PRINT_PATCH": "0", "OMP_NUM_THREADS": "1",
              "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
              "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": CPU_HEALTH_CHECK_INTERVAL_S}
