"""Fixtures of the training program's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.tmp_watch import short_tmp_dir
from tests.training.ray_cluster import WORKER_ENV


@pytest.fixture(scope="package")
def ray_address() -> Iterator[str]:
    """A private Ray for the tests of this package that submit to one (test_ray_train, test_sft_raydata,
    test_worker_restart: each job is its own driver, and a killed worker is a job's, never the cluster's),
    started once; workers inherit the environment the raylet starts with.

    Nothing of it is left in /tmp: Ray's temp dir (else /tmp/ray) and the workers' and drivers' own
    temporary files (Ray Train's checkpoint_tmp_* and _ray_lockfiles, under tempfile.gettempdir(),
    which reads TMPDIR) live in a short dir of the package's, removed after ray.shutdown()."""
    import ray

    # The environment is restored and the dir removed whatever happens.
    with pytest.MonkeyPatch.context() as mp, short_tmp_dir("ray") as ray_tmp:
        for key, value in {**WORKER_ENV, "TMPDIR": str(ray_tmp / "tmp")}.items():
            mp.setenv(key, value)
        (ray_tmp / "tmp").mkdir()
        # 4 logical CPUs on 2 cores: 2 for the training workers, the rest for Ray Data's tasks.
        ray.init(num_cpus=4, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False,
                 _temp_dir=str(ray_tmp / "r"))
        try:
            yield ray.get_runtime_context().gcs_address
        finally:
            ray.shutdown()
