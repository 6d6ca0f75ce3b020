"""The caller's public address (targets/aws/cloud/public_ip.py) is asked again after a passing failure: a 5xx,
a timeout or a dropped connection from checkip.amazonaws.com, which a laptop on a poor network meets,
does not refuse the plan. A 4xx is not asked again. No network: a server of the test's own on loopback."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from backend.errors import OperationError
from targets.aws.cloud import public_ip
from tests.serving import serve_in_thread


class Answers:
    """Answers each GET with the next status of ``statuses`` (200: an address), then keeps the last."""

    def __init__(self, *statuses: int) -> None:
        self.statuses, self.asked = list(statuses), 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                status = owner.statuses[min(owner.asked, len(owner.statuses) - 1)]
                owner.asked += 1
                if status != 200:
                    self.send_error(status)
                    return
                body = b"52.94.76.10\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(public_ip, "BACKOFF_S", 0.01)
    servers: list[Answers] = []

    def start(*statuses: int) -> Answers:
        answers = Answers(*statuses)
        serve_in_thread(answers.server)
        servers.append(answers)
        monkeypatch.setenv("RTUI_CHECKIP_URL", answers.url)
        return answers

    yield start
    for answers in servers:
        answers.server.shutdown()
        answers.server.server_close()


def test_a_5xx_is_asked_again_and_the_address_is_learned(serve: Any) -> None:
    answers = serve(503, 502, 200)
    assert public_ip.public_cidr() == "52.94.76.10/32"
    assert answers.asked == 3


def test_a_4xx_is_final_after_one_ask(serve: Any) -> None:
    answers = serve(403)
    with pytest.raises(OperationError, match="could not learn your public address"):
        public_ip.public_cidr()
    assert answers.asked == 1


def test_a_lasting_5xx_fails_after_every_attempt_with_the_way_out(serve: Any) -> None:
    answers = serve(503)
    with pytest.raises(OperationError) as failed:
        public_ip.public_cidr()
    assert answers.asked == public_ip.ATTEMPTS
    assert "--api-cidrs" in str(failed.value.remedy)


def test_a_refused_connection_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(public_ip, "BACKOFF_S", 0.01)
    asked: list[str] = []

    def refused(url: str, timeout: float) -> Any:
        asked.append(url)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(urllib.request, "urlopen", refused)
    with pytest.raises(OperationError, match="Connection refused"):
        public_ip.public_cidr()
    assert len(asked) == public_ip.ATTEMPTS
