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
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "anonymous-pull-token"  # the token of rtui/ray; another repository's is token_for(repo)


def token_for(repository: str) -> str:
    return TOKEN if repository == "rtui/ray" else f"anonymous-pull-token:{repository}"


def _digest(name: str) -> str:
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


DEFAULT_TAGS = {name: _digest(name) for name in (
    "rtui/ray:test", "nvidia/k8s-device-plugin:v0.18.0", "eks/aws-efa-k8s-device-plugin:v0.5.6",
    "kuberay/operator:v1.7.0")}


class FakeRegistry:
    def __init__(self, tags: dict[str, str] | None = None, *, token: bool = True,
                 layers: dict[str, list[int]] | None = None) -> None:
        self.tags = dict(DEFAULT_TAGS) if tags is None else tags
        self.token = token
        self.layers = layers or {}
        self.blobs: dict[str, tuple[str, bytes]] = {}  # digest -> (media type, body)
        registry = self
        self.requests: list[tuple[str, str, str | None]] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                return

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                registry.requests.append(("GET", self.path, self.headers.get("Authorization")))
                if self.path.startswith("/token"):
                    query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                    scope = (query.get("scope") or [""])[0]
                    repo = scope.removeprefix("repository:").rsplit(":", 1)[0]
                    body = json.dumps({"token": token_for(repo)}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                repo, _, ref = self.path.removeprefix("/v2/").partition("/manifests/")
                if not self._authorized(repo):
                    return
                found = registry.manifest(repo, ref)
                if found is None:
                    self.send_error(404)
                    return
                media, body = found
                self.send_response(200)
                self.send_header("Content-Type", media)
                self.send_header("Docker-Content-Digest", "sha256:" + hashlib.sha256(body).hexdigest())
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self, repo: str) -> bool:
                if registry.token and self.headers.get("Authorization") != f"Bearer {token_for(repo)}":
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", f'Bearer realm="{registry.url}/token",'
                                                         f'service="fake",scope="repository:{repo}:pull"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return False
                return True

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
                registry.requests.append(("HEAD", self.path, self.headers.get("Authorization")))
                repo, _, tag = self.path.removeprefix("/v2/").partition("/manifests/")
                if not self._authorized(repo):
                    return
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

    def image(self, name: str = "rtui/ray:test") -> str:
        return f"{self.host}/{name}"

    def __enter__(self) -> FakeRegistry:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
