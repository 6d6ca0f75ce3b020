"""An image tag's digest, asked of its registry at plan time (Docker Registry HTTP API v2).

Pinning by digest means every pod of the run, and a pod rescheduled hours later, runs the same
bits the plan showed. A registry that does not answer within the deadline leaves the tag
unpinned, and the plan says so: it never blocks a plan.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

DEADLINE_S = 4.0
_MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_LOOPBACK = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True)
class ImageRef:
    registry: str
    repository: str
    reference: str  # a tag, or a digest when the user pinned one

    @property
    def scheme(self) -> str:
        # Registries on this machine speak plain HTTP, as Docker allows for localhost.
        bracketed = self.registry.startswith("[")  # an IPv6 address
        host = self.registry.split("]")[0] + "]" if bracketed else self.registry.rsplit(":", 1)[0]
        return "http" if host in _LOOPBACK else "https"


@dataclass(frozen=True)
class Resolved:
    image: str
    digest: str | None
    reason: str  # why it is unpinned, or where the digest came from


def parse(image: str) -> ImageRef:
    """``host/repo:tag`` the way Docker reads it (no host: Docker Hub; no tag: latest)."""
    name, _, digest = image.partition("@")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
    else:
        registry, path = "registry-1.docker.io", name if "/" in name else f"library/{name}"
    repository, _, tag = path.rpartition(":") if ":" in path.rsplit("/", 1)[-1] else (path, "", "latest")
    return ImageRef(registry, repository, digest or tag)


def resolve_digest(image: str, *, timeout_s: float = DEADLINE_S) -> Resolved:
    """The digest ``image`` points at now, or None with the reason (never raises)."""
    ref = parse(image)
    if _DIGEST.fullmatch(ref.reference):
        return Resolved(image, ref.reference, "pinned in the config")
    url = f"{ref.scheme}://{ref.registry}/v2/{ref.repository}/manifests/{ref.reference}"
    try:
        digest = _head_digest(url, None, timeout_s)
    except _Unauthorized as challenge:
        try:
            token = _anonymous_token(challenge.header, timeout_s)
            digest = _head_digest(url, token, timeout_s)
        except (_Unauthorized, OSError, ValueError) as exc:
            return Resolved(image, None, f"unpinned: {ref.registry} refused an anonymous pull ({exc})")
    except (OSError, ValueError) as exc:
        return Resolved(image, None, f"unpinned: {ref.registry} did not answer ({_short(exc)})")
    if digest is None:
        return Resolved(image, None, f"unpinned: {ref.registry} sent no digest")
    return Resolved(image, digest, f"pinned: {ref.registry} answered")


class _Unauthorized(Exception):
    def __init__(self, header: str) -> None:
        super().__init__("401")
        self.header = header


def _head_digest(url: str, token: str | None, timeout_s: float) -> str | None:
    headers = {"Accept": _MANIFEST_TYPES}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, method="HEAD", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - a registry URL we built
            digest = resp.headers.get("Docker-Content-Digest", "")
    except urllib.error.HTTPError as exc:
        if exc.code == 401 and token is None:
            raise _Unauthorized(exc.headers.get("WWW-Authenticate", "")) from None
        raise OSError(f"HTTP {exc.code}") from None
    return digest if _DIGEST.fullmatch(digest) else None


def _anonymous_token(challenge: str, timeout_s: float) -> str:
    """A pull token from the realm a registry's ``WWW-Authenticate: Bearer`` challenge names."""
    scheme, _, params = challenge.partition(" ")
    if scheme.lower() != "bearer":
        raise ValueError(f"auth scheme {scheme or 'none'}")
    fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
    realm = fields.pop("realm", "")
    if not realm.startswith(("https://", "http://")):
        raise ValueError("no token realm")
    query = urllib.parse.urlencode({k: v for k, v in fields.items() if k in ("service", "scope")})
    with urllib.request.urlopen(f"{realm}?{query}", timeout=timeout_s) as resp:  # noqa: S310 - the registry's realm
        body = json.loads(resp.read())
    token = body.get("token") or body.get("access_token")
    if not isinstance(token, str):
        raise ValueError("no token in the answer")
    return token


def _short(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason if reason is not None else exc)[:80]


@dataclass(frozen=True)
class ImageSize:
    image: str
    compressed_bytes: int | None  # the linux/amd64 layers as downloaded; None: unknown
    reason: str


def image_size(image: str, *, timeout_s: float = DEADLINE_S) -> ImageSize:
    """What pulling ``image`` downloads for linux/amd64: the sum of its layers' sizes (never raises).

    A manifest's ``layers[].size`` are the compressed blobs' sizes (OCI image spec, manifest.md); what
    they unpack to on the node's disk is not in the registry (the caller estimates it)."""
    ref = parse(image)
    base = f"{ref.scheme}://{ref.registry}/v2/{ref.repository}/manifests/"
    token: str | None = None
    try:
        try:
            manifest = _get_manifest(base + ref.reference, None, timeout_s)
        except _Unauthorized as challenge:
            token = _anonymous_token(challenge.header, timeout_s)
            manifest = _get_manifest(base + ref.reference, token, timeout_s)
        if "manifests" in manifest:  # an index: the platform the nodes run (x86_64 AMIs)
            entry = next((m for m in manifest["manifests"]
                          if (m.get("platform") or {}).get("os") == "linux"
                          and (m.get("platform") or {}).get("architecture") == "amd64"), None)
            if entry is None:
                return ImageSize(image, None, f"{ref.registry} lists no linux/amd64 image")
            manifest = _get_manifest(base + str(entry["digest"]), token, timeout_s)
        layers = manifest.get("layers")
        if not isinstance(layers, list) or not layers:
            return ImageSize(image, None, f"{ref.registry} sent a manifest without layers")
        total = sum(int(layer.get("size") or 0) for layer in layers)
    except (_Unauthorized, OSError, ValueError, KeyError, TypeError) as exc:
        return ImageSize(image, None, f"{ref.registry} did not tell the image's size ({_short(exc)})")
    return ImageSize(image, total, f"{ref.registry}: {len(layers)} layers, {total / 1e9:.1f} GB compressed")


def _get_manifest(url: str, token: str | None, timeout_s: float) -> dict[str, Any]:
    headers = {"Accept": _MANIFEST_TYPES}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - a registry URL we built
            body = json.loads(resp.read(4_000_000))
    except urllib.error.HTTPError as exc:
        if exc.code == 401 and token is None:
            raise _Unauthorized(exc.headers.get("WWW-Authenticate", "")) from None
        raise OSError(f"HTTP {exc.code}") from None
    if not isinstance(body, dict):
        raise ValueError("not a manifest")
    return body
