"""A local stand-in for ``https://checkip.amazonaws.com``: it answers the caller's public address as one
line of text, as AWS's does (``<address>\\n``). rtui reaches it through ``RTUI_CHECKIP_URL`` only, so no
test ever asks the internet. ``answer`` is what it says (None: it fails with HTTP 503).

It serves from its own process, as the real endpoint does. In the test's process it shared the GIL with
the in-process moto server and the provisioning under test, and on a loaded CI machine one answer took
longer than rtui's timeout (``could not learn your public address … (timed out)``), a failure of the
double, not of rtui. The test side sets ``answer`` and reads ``asked`` through a control path
(``/_control``) that rtui never asks for.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_ANSWER = "52.94.76.10"
CONTROL = "/_control"
NONE = "-"  # the control body for "answer nothing" (HTTP 503)


def serve() -> None:
    """The server process: prints its port, then serves until its stdin closes or it is terminated."""
    state: dict[str, Any] = {"answer": DEFAULT_ANSWER, "asked": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == CONTROL:
                self._text(str(state["asked"]))
                return
            state["asked"] += 1
            if state["answer"] is None:
                self.send_error(503)
                return
            self._text(state["answer"] + "\n")

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            state["answer"] = None if body == NONE else body
            state["asked"] = 0 if self.path.endswith("/reset") else state["asked"]
            self._text("ok")

        def _text(self, text: str) -> None:
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain;charset=UTF-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()  # the test's process holds the other end: it ended, or closed it to stop this one


class CheckIp:
    def __init__(self) -> None:
        self._answer: str | None = DEFAULT_ANSWER
        self._process: subprocess.Popen[str] | None = None
        self._port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}/"

    @property
    def answer(self) -> str | None:
        return self._answer

    @answer.setter
    def answer(self, value: str | None) -> None:
        self._post(CONTROL, value)
        self._answer = value

    @property
    def asked(self) -> int:
        with urllib.request.urlopen(self.url.rstrip("/") + CONTROL, timeout=30) as reply:
            return int(reply.read())

    def start(self) -> None:
        self._process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True)
        assert self._process.stdout is not None
        self._port = int(self._process.stdout.readline())

    def stop(self) -> None:
        if self._process is not None:
            self._process.communicate()  # closes its stdin: it ends
            self._process = None

    def reset(self) -> None:
        self._post(CONTROL + "/reset", DEFAULT_ANSWER)
        self._answer = DEFAULT_ANSWER

    def _post(self, path: str, value: str | None) -> None:
        request = urllib.request.Request(self.url.rstrip("/") + path, data=(NONE if value is None else value).encode(),
                                         method="POST")
        urllib.request.urlopen(request, timeout=30).close()


CHECKIP = CheckIp()

if __name__ == "__main__":
    serve()
