from __future__ import annotations

from pathlib import Path

import pytest

from tests.telemetry.tel_support import NCCL_LOGS


@pytest.fixture
def nccl_logs() -> Path:
    if not (NCCL_LOGS / "MANIFEST.json").is_file():
        pytest.skip(f"real NCCL logs not available at {NCCL_LOGS} (../shared/nccl_logs from the repo root)")
    return NCCL_LOGS
