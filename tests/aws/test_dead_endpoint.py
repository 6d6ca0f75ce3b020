"""An AWS endpoint that accepts connections and never answers: every AWS command ends, or says
what it waits for, well within 30 s, and names the endpoint. Timed on the real binary."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from backend.errors import OperationError
from targets.aws.cloud import PreflightRequest, check_command, run_preflight
from targets.aws.session import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, RETRY_ATTEMPTS, AwsSession
from tests.aws.conftest import _ENV, _UNSET, World
from tests.conftest import RTUI

SILENCE_LIMIT_S = 30.0


class SilentServer:
    """Accepts every connection on 127.0.0.1 and never sends a byte; gone after ``lifetime_s``."""

    def __init__(self, lifetime_s: float = 90.0) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._deadline = time.monotonic() + lifetime_s
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, name="silent-aws", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set() and time.monotonic() < self._deadline:
                try:
                    conn, _ = self._listener.accept()
                except TimeoutError:
                    continue
                self._held.append(conn)  # held open, never read, never answered
        finally:
            for conn in self._held:
                conn.close()
            self._listener.close()

    @property
    def connections(self) -> int:
        return len(self._held)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def silent_endpoint() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.stop()


def aws_env(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    return {**env, **_ENV, "AWS_ENDPOINT_URL": endpoint}


def rtui_at(*args: str, endpoint: str, aws_timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
    """The command against ``endpoint``. How soon it ends is not asserted (a stopwatch is a benchmark's):
    its one line says which deadline ended it, and test_every_client_has_timeouts_and_bounded_retries
    checks those deadlines end a silent endpoint's wait long before one call's retries would.
    ``aws_timeout_s``: the listing's deadline (RTUI_AWS_TIMEOUT_S), else the default."""
    env = aws_env(endpoint) | ({} if aws_timeout_s is None else {"RTUI_AWS_TIMEOUT_S": str(aws_timeout_s)})
    return subprocess.run([RTUI, *args], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                          timeout=120)


PLAIN_CHECK = ["check", "--target", "aws"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        PLAIN_CHECK,
        ["check", "--target", "aws", "--json", "--all-regions"],
        ["check", "--target", "aws", "--request-quota-increase", "--yes"],
    ],
)
def test_a_dead_endpoint_ends_the_command_with_one_line_naming_it(
    silent_endpoint: SilentServer, args: list[str]
) -> None:
    # Was silent 141 s before the deadlines. The first command meets the default one; the others end at a
    # shorter one, set as a user would (the same path: it is the listing's deadline either way).
    proc = rtui_at(*args, endpoint=silent_endpoint.url, aws_timeout_s=None if args == PLAIN_CHECK else 3)
    assert silent_endpoint.connections >= 1, "the command never reached the endpoint"
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert err.startswith(f"rtui: no answer from AWS at {silent_endpoint.url}"), err
    assert "listing regions" in err and "AWS_ENDPOINT_URL" in err


def test_a_refused_connection_names_the_endpoint() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    proc = rtui_at("check", "--target", "aws", endpoint=closed)
    assert proc.returncode == 1
    assert f"could not reach AWS at {closed}" in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("endpoint", ["not-a-url", "http://[::1"])
def test_a_malformed_endpoint_url_is_bad_input(endpoint: str) -> None:
    proc = rtui_at("check", "--target", "aws", endpoint=endpoint)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert err.startswith("rtui: the AWS endpoint URL is not usable") and "AWS_ENDPOINT_URL" in err
    assert err.count("\n") == 0


def test_every_client_has_timeouts_and_bounded_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in _ENV.items():
        monkeypatch.setenv(key, value)
    config = AwsSession().client("ec2", "us-east-1").meta.config
    assert (config.connect_timeout, config.read_timeout) == (CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
    assert config.retries == {"mode": "standard", "total_max_attempts": RETRY_ATTEMPTS + 1}
    # The listing deadline has to end the wait long before one call's retries would.
    assert PreflightRequest().listing_timeout_s < SILENCE_LIMIT_S < (RETRY_ATTEMPTS + 1) * READ_TIMEOUT_S


async def test_listing_that_hangs_stops_at_its_deadline(world: World) -> None:
    world.script.hang_regions.add("us-east-1")
    with pytest.raises(OperationError) as caught:
        await run_preflight(PreflightRequest(regions=["eu-west-2"], listing_timeout_s=1))
    assert f"no answer from AWS at {world.endpoint} within 1 s while listing regions" in str(caught.value)


def test_the_aws_timeout_setting_sets_the_listing_deadline(world: World) -> None:
    """A user on a slow link sets RTUI_AWS_TIMEOUT_S; a hung listing then ends at that (and the region
    and whole-check deadlines follow it: targets/aws/infra/preflight_request.request_for)."""
    world.script.hang_regions.add("us-east-1")
    proc = subprocess.run([RTUI, "check", "--target", "aws", "--region", "us-east-1"], capture_output=True,
                          text=True, env={**os.environ, "RTUI_AWS_TIMEOUT_S": "1.5"}, stdin=subprocess.DEVNULL,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(f"rtui: no answer from AWS at {world.endpoint} within 1.5 s while listing"), \
        proc.stderr


async def test_the_whole_check_has_a_deadline(world: World) -> None:
    world.script.hang_regions.add("eu-west-2")
    with pytest.raises(OperationError, match=r"did not finish within 1\.5 s \(AWS at http://127\.0\.0\.1"):
        await run_preflight(PreflightRequest(regions=["us-east-1", "eu-west-2"], deadline_s=1.5))


def test_a_slow_check_says_what_it_waits_for_even_without_a_tty(world: World) -> None:
    world.script.hang_regions.add("eu-west-2")
    out, err = io.StringIO(), io.StringIO()
    request = PreflightRequest(regions=["us-east-1", "eu-west-2"], region_timeout_s=5)
    code = check_command(request, as_json=True, stdout=out, stderr=err, heartbeat_s=0.8)
    assert code == 0  # us-east-1 answered; eu-west-2 is reported unreachable
    lines = err.getvalue().splitlines()
    assert len(lines) >= 2, lines
    assert all(line.startswith(f"rtui: still waiting for AWS at {world.endpoint}: ") for line in lines), lines
    assert "1 of 2 regions still to answer (eu-west-2)" in lines[-1], lines
