"""A container registry on loopback that answers manifest HEADs the way public registries do.

With ``token=True`` it first answers 401 with a ``WWW-Authenticate: Bearer`` challenge whose realm
hands out an anonymous pull token (public.ecr.aws, Docker Hub and quay.io all do this).
"""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "anonymous-pull-token"


class FakeRegistry:
    def __init__(self, tags: dict[str, str] | None = None, *, token: bool = True) -> None:
        self.tags = tags or {"rtui/ray:test": "sha256:" + hashlib.sha256(b"rtui-ray-test").hexdigest()}
        self.token = token
        self.requests: list[tuple[str, str, str | None]] = []
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                return

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                registry.requests.append(("GET", self.path, self.headers.get("Authorization")))
                if self.path.startswith("/token"):
                    body = f'{{"token": "{TOKEN}"}}'.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_error(404)

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
                registry.requests.append(("HEAD", self.path, self.headers.get("Authorization")))
                if registry.token and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", f'Bearer realm="{registry.url}/token",'
                                                         f'service="fake",scope="repository:rtui/ray:pull"')
                    self.end_headers()
                    return
                repo, _, tag = self.path.removeprefix("/v2/").partition("/manifests/")
                digest = registry.tags.get(f"{repo}:{tag}")
                if digest is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Docker-Content-Digest", digest)
                self.send_header("Content-Type", "application/vnd.oci.image.index.v1+json")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.host = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def image(self, name: str = "rtui/ray:test") -> str:
        return f"{self.host}/{name}"

    def __enter__(self) -> FakeRegistry:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
