"""Shared fixtures: an isolated state dir per test, and helpers to run the real `rtui` binary; the
session fails if it left an rtui- or Ray-made entry in /tmp (tests/tmp_watch.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tmp_watch import (
    TMP,
    made_by_another_session,
    new_run_token,
    reap_clusters_under,
    short_tmp_dir,
    watched_entries,
)

REPO = Path(__file__).resolve().parents[1]
RTUI = str(Path(sys.executable).parent / "rtui")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No test reads the user's config or writes the user's state or cache (the EKS CA cache, the
    kubeconfig TLS files: a test's land under its tmp_path, not in ~/.cache/rtui)."""
    for key in list(os.environ):
        if key.startswith("RTUI_"):
            monkeypatch.delenv(key)
    state = tmp_path / "state"
    monkeypatch.setenv("RTUI_STATE_DIR", str(state))
    monkeypatch.setenv("RTUI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("RTUI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    yield state
    # A failed test must not leave a Ray cluster running for the rest of the suite, nor its marked dir
    # in /tmp: its own (this state dir) and those of the rtui processes it ran with a state dir of
    # their own under tmp_path (a bench script's). Teardown runs whether the test passed or not.
    reap_clusters_under(tmp_path)


@pytest.fixture
def job_of_unknown_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the dashboard tests that feed a local run (tests.test_tui_dashboard.dashboard_session) the NCCL
    lines of 2-node GPU jobs, which the local target never prints: its own node count, one machine (issue
    39), would rightly contradict them, so it is left out. tests/test_badge_job_nodes.py drives the badge
    with a run's own count."""
    from targets.local import LocalTarget

    monkeypatch.setattr(LocalTarget, "job_nodes", lambda self, config: None)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A dir of the test's own right under /tmp, for a path that must stay short (Ray's temp dir, whose
    unix sockets may not pass 107 bytes; pytest's tmp_path under xdist comes close). Removed after the
    test, whatever became of it."""
    with short_tmp_dir() as path:
        yield path


def run_rtui(*args: str, timeout: float = 300, env: dict[str, str] | None = None,
             check: bool = False) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([RTUI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"rtui {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test`), tests that start a real Ray cluster or drive tmux share one
    group: one worker runs them one after another, as a serial run does, while the rest spread.
    So do the tests marked ``host_clusters``: a local cluster is found host-wide (its marked dir
    under /tmp), so a test that makes one, or that counts on seeing no other rtui's (no orphans, "no
    runs yet", `down` by the default name), must not run beside another that has one up.

    First, before xdist's own hook reads the ``xdist_group`` marks into the node ids: run after
    it, the marks came too late and the group was never formed (a Ray bench and a Ray test ran
    side by side on two workers, and each saw the other's cluster as an orphan)."""
    for item in items:
        if any(item.get_closest_marker(name) for name in ("ray", "tmux", "host_clusters")):
            item.add_marker(pytest.mark.xdist_group("ray"))
        if is_on_doubles(item):
            item.add_marker(pytest.mark.doubles)


# The fixtures that start a server double (moto's server, the Kubernetes emulator, the S3 stand-in).
SERVER_FIXTURES = frozenset({"moto_endpoint", "kube_cluster", "s3_endpoint"})


def is_on_doubles(item: pytest.Item) -> bool:
    """The aws and kube targets' own suites, and any test that starts a server double: the ``doubles``
    mark, left out of `make test-fast` (they are most of the suite's time outside Ray)."""
    parts = Path(str(item.path)).relative_to(REPO).parts
    return parts[:2] in (("tests", "aws"), ("tests", "kube")) or bool(
        SERVER_FIXTURES & set(getattr(item, "fixturenames", ())))


_TMP_AT_START = pytest.StashKey[set[str]]()


@pytest.hookimpl(trylast=True)  # after pytest's own, which makes the run's temporary path factory
def pytest_configure(config: pytest.Config) -> None:
    """Snapshot the watched entries of /tmp, in the controller only under xdist (workers have
    ``workerinput``): the check is the whole run's, made once after every worker has finished.

    torch makes its compile cache dir when torch._dynamo is imported (transformers' models import
    it), in tempfile.gettempdir() unless TORCHINDUCTOR_CACHE_DIR names one
    (torch/_inductor/runtime/cache_dir_utils.py): the run's, and the workers' (they inherit this
    environment), is under the run's base temp, as every file a test makes."""
    if not hasattr(config, "workerinput"):
        new_run_token()
        config.stash[_TMP_AT_START] = watched_entries()
        factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(factory.getbasetemp() / "torchinductor")


@pytest.hookimpl(trylast=True)  # after xdist's own sessionfinish has stopped the workers
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if /tmp gained an rtui- or Ray-made entry since it started (issue 37): every file a
    test makes belongs under its tmp_path, and a local cluster must be gone when its test ends.

    A local cluster of this run still up (its test was killed past its teardown) is stopped and removed
    here, and still reported. Entries that were there before the run are not its doing."""
    config = session.config
    if hasattr(config, "workerinput") or _TMP_AT_START not in config.stash:
        return
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    basetemp = factory.getbasetemp()
    reaped = [str(p.relative_to(TMP)) for p in reap_clusters_under(basetemp)]
    before: set[str] = config.stash[_TMP_AT_START]
    new = sorted(name for name in watched_entries() - before if not made_by_another_session(TMP / name, basetemp))
    leftovers = sorted({*new, *reaped})
    if not leftovers:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")  # after the progress line, which -q leaves open
        reporter.write_sep("=", f"new in {TMP} since the run started ({len(leftovers)}): the run fails", red=True)
        for name in leftovers:
            still_up = "  (a local cluster still up: stopped and removed now)" if name in reaped else ""
            reporter.write_line(f"  {TMP / name}{still_up}")
        reporter.write_line("  Make them under the test's tmp_path (or tests.tmp_watch.short_tmp_dir), "
                            "and remove them if the test made them elsewhere.")
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
