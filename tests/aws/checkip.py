"""A local stand-in for ``https://checkip.amazonaws.com``: it answers the caller's public address as one
line of text, as AWS's does (``<address>\\n``). rtui reaches it through ``RTUI_CHECKIP_URL`` only, so no
test ever asks the internet. ``answer`` is what it says (None: it fails with HTTP 503)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_ANSWER = "52.94.76.10"


class CheckIp:
    def __init__(self) -> None:
        self.answer: str | None = DEFAULT_ANSWER
        self.asked = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                owner.asked += 1
                if owner.answer is None:
                    self.send_error(503)
                    return
                body = (owner.answer + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain;charset=UTF-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reset(self) -> None:
        self.answer, self.asked = DEFAULT_ANSWER, 0


CHECKIP = CheckIp()
