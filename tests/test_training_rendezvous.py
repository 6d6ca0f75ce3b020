"""Where a job's workers form torch's process group: the target's choice, never the program's guess.

The local target names a private dir (``RTUI_RENDEZVOUS_DIR``) and its workers meet through a FileStore
there (tests/test_local_security.py watches the sockets of a real job); without one, a cluster target
(kube, aws: workers in several pods) keeps Ray Train's own TCP rendezvous.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ray.train.torch import TorchConfig

from training.raytrain import RENDEZVOUS_DIR_ENV
from training.rendezvous import FileRendezvousConfig, torch_config
from training.train import parse_args


def test_without_a_dir_the_rendezvous_is_ray_trains_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RENDEZVOUS_DIR_ENV, raising=False)
    assert parse_args([]).rendezvous_dir is None
    config = torch_config(None)
    assert type(config) is TorchConfig and config.init_method == "env"


def test_the_targets_dir_gives_a_private_file_rendezvous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = tmp_path / "rendezvous"
    monkeypatch.setenv(RENDEZVOUS_DIR_ENV, str(where))
    cfg = parse_args([])
    assert cfg.rendezvous_dir == str(where)
    config = torch_config(cfg.rendezvous_dir)
    assert isinstance(config, FileRendezvousConfig) and config.directory == str(where)
    assert where.is_dir() and where.stat().st_mode & 0o777 == 0o700
