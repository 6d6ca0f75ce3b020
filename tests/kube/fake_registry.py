"""A container registry on loopback that answers manifest HEADs the way public registries do.

With ``token=True`` it first answers 401 with a ``WWW-Authenticate: Bearer`` challenge whose realm
hands out an anonymous pull token (public.ecr.aws, Docker Hub and quay.io all do this). As in the
token authentication spec (distribution/distribution ``docs/spec/auth/token.md``; Docker's
``reference/api/registry/auth``), the challenge's ``scope`` names the repository asked for
(``repository:<name>:pull``), the realm hands out a token for the scope in its query, and that token
opens that repository only: a token of another repository is answered 401 again.

``HEAD /v2/<name>/manifests/<tag>`` (OCI distribution spec, "Checking if content exists in the
registry") answers 200 with ``Docker-Content-Digest`` (for a multi-platform tag, the *index*'s
digest) and the manifest's media type, or 404 for a tag the repository does not have, without a body.
The default ``tags`` hold the Ray test image and the add-on images rtui installs (device plugins,
KubeRay operator) under their upstream paths, as a mirror (``--addon-registry``) serves them.

``GET`` of a tag's manifest answers as a multi-platform image does (OCI distribution spec, "Pulling
manifests"; OCI image spec ``image-index.md`` and ``manifest.md``): the tag names an image index whose
``manifests[]`` carry a ``platform`` (os, architecture) and a digest; ``GET`` of that digest answers the
platform's image manifest, whose ``layers[].size`` are the sizes of the *compressed* layer blobs (what
is downloaded, not what is unpacked on disk). ``layers`` sets those sizes per tag (linux/amd64; an
arm64 entry with other sizes sits beside it, as on Docker Hub).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONTROL = "/_control"
TOKEN = "anonymous-pull-token"  # the token of rtui/ray; another repository's is token_for(repo)


def token_for(repository: str) -> str:
    return TOKEN if repository == "rtui/ray" else f"anonymous-pull-token:{repository}"


def _digest(name: str) -> str:
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


DEFAULT_TAGS = {name: _digest(name) for name in (
    "rtui/ray:test", "nvidia/k8s-device-plugin:v0.18.0", "eks/aws-efa-k8s-device-plugin:v0.5.6",
    "kuberay/operator:v1.7.0")}


class _Registry:
    """The server's state and handler, in the registry's own process (``serve``)."""

    def __init__(self, tags: dict[str, str], token: bool, layers: dict[str, list[int]]) -> None:
        self.tags, self.token, self.layers = tags, token, layers
        self.blobs: dict[str, tuple[str, bytes]] = {}  # digest -> (media type, body)
        self.requests: list[tuple[str, str, str | None]] = []
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                return

            def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name; the test's control path only
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == CONTROL + "/tags":
                    registry.tags = json.loads(body)
                self._send(200)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path == CONTROL + "/requests":
                    self._send(200, json.dumps(registry.requests).encode())
                    return
                registry.requests.append(("GET", self.path, self.headers.get("Authorization")))
                if self.path.startswith("/token"):
                    query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                    scope = (query.get("scope") or [""])[0]
                    repo = scope.removeprefix("repository:").rsplit(":", 1)[0]
                    self._send(200, json.dumps({"token": token_for(repo)}).encode(),
                               {"Content-Type": "application/json"})
                    return
                repo, _, ref = self.path.removeprefix("/v2/").partition("/manifests/")
                if not self._authorized(repo):
                    return
                found = registry.manifest(repo, ref)
                if found is None:
                    self.send_error(404)
                    return
                media, body = found
                self._send(200, body, {"Content-Type": media,
                                       "Docker-Content-Digest": "sha256:" + hashlib.sha256(body).hexdigest()})

            def _authorized(self, repo: str) -> bool:
                if registry.token and self.headers.get("Authorization") != f"Bearer {token_for(repo)}":
                    host = self.headers.get("Host")
                    self._send(401, headers={"WWW-Authenticate": f'Bearer realm="http://{host}/token",'
                                                                 f'service="fake",scope="repository:{repo}:pull"'})
                    return False
                return True

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
                registry.requests.append(("HEAD", self.path, self.headers.get("Authorization")))
                repo, _, tag = self.path.removeprefix("/v2/").partition("/manifests/")
                if not self._authorized(repo):
                    return
                digest = registry.tags.get(f"{repo}:{tag}")
                if digest is None:
                    self._send(404)
                    return
                self._send(200, headers={"Docker-Content-Digest": digest,
                                         "Content-Type": "application/vnd.oci.image.index.v1+json"})

        self.handler = Handler

    def manifest(self, repo: str, ref: str) -> tuple[str, bytes] | None:
        """The body a GET of ``repo``'s manifest ``ref`` (a tag or a digest) answers."""
        if ref in self.blobs:
            return self.blobs[ref]
        sizes = self.layers.get(f"{repo}:{ref}")
        if sizes is None:
            return None
        index = []
        for arch, layer_sizes in (("amd64", sizes), ("arm64", [s // 2 for s in sizes])):
            image = json.dumps({
                "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": 1234,
                           "digest": "sha256:" + hashlib.sha256(arch.encode()).hexdigest()},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "size": size,
                            "digest": "sha256:" + hashlib.sha256(f"{arch}{i}".encode()).hexdigest()}
                           for i, size in enumerate(layer_sizes)]}).encode()
            digest = "sha256:" + hashlib.sha256(image).hexdigest()
            self.blobs[digest] = ("application/vnd.oci.image.manifest.v1+json", image)
            index.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": len(image),
                          "digest": digest, "platform": {"os": "linux", "architecture": arch}})
        body = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                           "manifests": index}).encode()
        return "application/vnd.oci.image.index.v1+json", body


def serve() -> None:
    """The registry's process: reads its settings (one JSON line), prints its port, serves until its
    stdin closes (the test's process ended, or closed it to stop this one)."""
    settings = json.loads(sys.stdin.readline())
    registry = _Registry(settings["tags"], settings["token"], settings["layers"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), registry.handler)
    print(server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()


class _Tags(dict[str, str]):
    """The registry's tags on the test's side: a change is sent to the registry's process at once."""

    def __init__(self, tags: dict[str, str], sync: Callable[[dict[str, str]], None]) -> None:
        super().__init__(tags)
        self._sync = sync

    def __setitem__(self, key: str, value: str) -> None:
        super().__setitem__(key, value)
        self._sync(dict(self))

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._sync(dict(self))


class FakeRegistry:
    """The registry, served from a process of its own as a real one is: from a thread of the test's
    process it shared the GIL with moto, the Kubernetes emulator and the code under test, and on a
    loaded machine an answer could miss rtui's 4 s deadline (``targets.kube.registry``),
    as checkip's did (tests/aws/checkip.py). The test reads ``requests`` and changes ``tags`` through a
    control path (``/_control``) that rtui never asks for."""

    def __init__(self, tags: dict[str, str] | None = None, *, token: bool = True,
                 layers: dict[str, list[int]] | None = None) -> None:
        self.token = token
        self.layers = layers or {}
        self.tags = _Tags(dict(DEFAULT_TAGS) if tags is None else tags, self._send_tags)
        self._process: subprocess.Popen[str] | None = None
        self._final: list[tuple[str, str, str | None]] = []
        self.url = self.host = ""

    @property
    def requests(self) -> list[tuple[str, str, str | None]]:
        """What it was asked, in order (after the ``with`` block: all it was asked)."""
        if self._process is None:
            return self._final
        with urllib.request.urlopen(self.url + CONTROL + "/requests", timeout=30) as reply:
            return [(method, path, auth) for method, path, auth in json.loads(reply.read())]

    def _send_tags(self, tags: dict[str, str]) -> None:
        if self._process is not None:
            request = urllib.request.Request(self.url + CONTROL + "/tags", data=json.dumps(tags).encode(),
                                             method="POST")
            urllib.request.urlopen(request, timeout=30).close()

    def image(self, name: str = "rtui/ray:test") -> str:
        return f"{self.host}/{name}"

    def __enter__(self) -> FakeRegistry:
        self._process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True)
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps({"tags": dict(self.tags), "token": self.token,
                                              "layers": self.layers}) + "\n")
        self._process.stdin.flush()
        port = int(self._process.stdout.readline())
        self.url, self.host = f"http://127.0.0.1:{port}", f"127.0.0.1:{port}"
        return self

    def __exit__(self, *_: object) -> None:
        if self._process is not None:
            self._final = self.requests
            self._process.communicate()  # closes its stdin: it ends
            self._process = None


if __name__ == "__main__":
    serve()
