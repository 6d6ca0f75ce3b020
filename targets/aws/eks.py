"""EKS access: the bearer token (DESIGN.md §4) and the kubeconfig entry that lets kubectl and k9s in.

The token is what ``aws eks get-token`` and aws-iam-authenticator make: a presigned STS
GetCallerIdentity URL with the header ``x-k8s-aws-id: <cluster>`` signed in. EKS calls that URL to
learn who we are. Building it is local signing only: no network. It is never written to disk; the
kubeconfig entry holds an exec plugin that makes a fresh one whenever kubectl needs it.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

import boto3
import yaml

from backend.boto import boto3_session
from backend.paths import private_cache_dir
from targets.aws.infra.api import partition
from targets.kube import kubeconfig_text

TOKEN_PREFIX = "k8s-aws-v1."
RUN_TAG = "rtui:run"  # the aws layer's tag naming the run that made a resource (DESIGN.md §1)
CLUSTER_ID_HEADER = "x-k8s-aws-id"
EXEC_API_VERSION = "client.authentication.k8s.io/v1beta1"
# EKS accepts a token for 15 minutes after signing, whatever X-Amz-Expires says; aws-iam-authenticator
# presigns with 60 s and so do we, to match what the server expects to see.
PRESIGN_EXPIRES_S = 60
TOKEN_LIFETIME = dt.timedelta(minutes=15)
REFRESH_MARGIN = dt.timedelta(minutes=1)


def eks_token(cluster_name: str, region: str, session: boto3.Session) -> tuple[str, dt.datetime]:
    """A bearer token for ``cluster_name`` and when it stops working (UTC)."""
    sts = session.client("sts", region_name=region, endpoint_url=f"https://sts.{region}.{partition(region).dns_suffix}")

    def sign_cluster_id(request: Any, **_: Any) -> None:
        request.headers[CLUSTER_ID_HEADER] = cluster_name

    # before-sign: the header must be in the request when SigV4 computes SignedHeaders.
    sts.meta.events.register("before-sign.sts.GetCallerIdentity", sign_cluster_id)
    signed_at = dt.datetime.now(dt.UTC)
    url: str = sts.generate_presigned_url("get_caller_identity", Params={}, ExpiresIn=PRESIGN_EXPIRES_S,
                                          HttpMethod="GET")
    token = TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")
    return token, signed_at + TOKEN_LIFETIME


class EksTokenProvider:
    """A cached token, renewed a minute before it expires: call it before every request."""

    def __init__(self, cluster_name: str, region: str, session: boto3.Session) -> None:
        self.cluster_name, self.region, self._session = cluster_name, region, session
        self._lock = threading.Lock()  # the client may ask from several threads at once
        self._token: str | None = None
        self._expires_at = dt.datetime.min.replace(tzinfo=dt.UTC)

    @property
    def expires_at(self) -> dt.datetime:
        return self._expires_at

    def __call__(self) -> str:
        with self._lock:
            if self._token is None or dt.datetime.now(dt.UTC) >= self._expires_at - REFRESH_MARGIN:
                self._token, self._expires_at = eks_token(self.cluster_name, self.region, self._session)
            return self._token


def token_command_output(cluster: str, region: str, profile: str | None = None) -> str:
    """What ``rtui token`` prints: an ExecCredential kubectl reads from an exec plugin."""
    session = boto3_session(profile, region)
    token, expires_at = eks_token(cluster, region, session)
    # Tell kubectl a minute early, as `aws eks get-token` does, so it never sends a dying token.
    expiry = (expires_at - REFRESH_MARGIN).strftime("%Y-%m-%dT%H:%M:%SZ")
    return json.dumps({
        "apiVersion": EXEC_API_VERSION,
        "kind": "ExecCredential",
        "spec": {},
        "status": {"token": token, "expirationTimestamp": expiry},
    })


def exec_plugin(cluster_name: str, region: str, profile: str | None = None,
                rtui_bin: str | None = None) -> dict[str, Any]:
    """The kubeconfig ``user.exec`` block: the AWS CLI when installed, else rtui itself."""
    if shutil.which("aws"):
        command = "aws"
        args = ["--region", region, "eks", "get-token", "--cluster-name", cluster_name, "--output", "json"]
    else:
        command = rtui_bin or shutil.which("rtui") or "rtui"
        args = ["token", "--cluster-name", cluster_name, "--region", region]
        if profile:
            args += ["--profile", profile]
    plugin: dict[str, Any] = {"apiVersion": EXEC_API_VERSION, "command": command, "args": args,
                              "interactiveMode": "Never", "provideClusterInfo": False}
    if profile:
        plugin["env"] = [{"name": "AWS_PROFILE", "value": profile}]
    return plugin


def write_kubeconfig_entry(path: str | os.PathLike[str], *, cluster_name: str, region: str, endpoint: str,
                           ca_data_b64: str, arn: str, profile: str | None = None, rtui_bin: str | None = None,
                           set_current: bool = False) -> str:
    """Merge our cluster/user/context (all named by the cluster ARN, as the AWS CLI does) into a kubeconfig.

    Every other entry stays byte for byte (comments included); re-running replaces only ours. The
    current-context changes only when ``set_current`` or when the file had none (a new file).
    Written atomically; a new file is 0600. Returns the context name.
    """
    target = Path(path).expanduser()
    config: dict[str, Any] = {}
    mode = 0o600
    text = ""
    if target.exists():
        text = target.read_text()
        config = yaml.safe_load(text) or {}
        if not isinstance(config, dict):
            raise ValueError(f"{target} is not a kubeconfig (a YAML mapping)")
        mode = target.stat().st_mode & 0o777
    name = arn
    entries = {
        "clusters": {"name": name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data_b64}},
        "users": {"name": name, "user": {"exec": exec_plugin(cluster_name, region, profile, rtui_bin)}},
        "contexts": {"name": name, "context": {"cluster": name, "user": name}},
    }
    current = name if set_current or not config.get("current-context") else None
    if text.strip():
        spliced: str | None = text
        for section, entry in entries.items():
            spliced = kubeconfig_text.splice_entry(spliced, section, name, entry) if spliced is not None else None
        if spliced is not None and current is not None:
            spliced = kubeconfig_text.set_scalar(spliced, "current-context", current)
        if spliced is not None:
            _write_text_atomically(target, spliced, mode)
            return name
    config.setdefault("apiVersion", "v1")
    config.setdefault("kind", "Config")
    config.setdefault("preferences", {})
    for section, entry in entries.items():
        _upsert(config, section, entry)
    if current is not None:
        config["current-context"] = current
    _write_atomically(target, config, mode)
    return name


def kubeconfig_path(flag: str | None) -> Path:
    """Where `aws eks update-kubeconfig` writes: --kubeconfig, the first of KUBECONFIG, ~/.kube/config."""
    source = flag or os.environ.get("KUBECONFIG") or "~/.kube/config"
    first = next((p for p in source.split(os.pathsep) if p), "~/.kube/config")
    return Path(first).expanduser()


def ca_file(ca_data_b64: str) -> str:
    """A cluster's CA (base64 PEM, as DescribeCluster and kubeconfigs give it) in a file the HTTP client
    can load: in rtui's cache, named by its hash, 0600 in a 0700 dir of ours.

    The name alone is never trusted: the client verifies the API server against this file and then
    sends it the EKS token, so a file found there (planted, a link, another CA) is read and, unless it
    holds exactly the CA EKS reported just now, replaced."""
    ca = base64.b64decode(ca_data_b64)
    folder = private_cache_dir("eks", what="EKS CA cache")
    target = folder / f"{hashlib.sha256(ca).hexdigest()[:16]}.pem"
    if not _holds_exactly(target, ca):
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=folder)  # made 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(ca)
            os.replace(tmp, target)  # replaces a link itself, never the file it points to
        except BaseException:
            os.unlink(tmp)
            raise
    return str(target)


def _holds_exactly(path: Path, content: bytes) -> bool:
    """A regular file of ours, 0600, with exactly ``content`` (a link or anything else: no)."""
    try:
        found = path.lstat()
        if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid() or stat.S_IMODE(found.st_mode) != 0o600:
            return False
        return path.read_bytes() == content
    except OSError:
        return False


def remove_kubeconfig_entry(path: str | os.PathLike[str], name: str) -> bool:
    """Take out the cluster, user and context named ``name`` (ours), as ``eksctl delete cluster`` does;
    every other byte of the file stays (the current-context, if it was ours, becomes empty)."""
    target = Path(path).expanduser()
    if not target.exists():
        return False
    text = target.read_text()
    config = yaml.safe_load(text) or {}
    if not isinstance(config, dict):
        return False
    spliced: str | None = text
    for section in ("clusters", "users", "contexts"):
        spliced = kubeconfig_text.splice_entry(spliced, section, name, None) if spliced is not None else None
    if spliced is not None and config.get("current-context") == name:
        spliced = kubeconfig_text.set_scalar(spliced, "current-context", "")
    if spliced is not None:
        if spliced != text:
            _write_text_atomically(target, spliced, target.stat().st_mode & 0o777)
        return spliced != text
    removed = False
    for section in ("clusters", "users", "contexts"):
        items = [i for i in config.get(section) or [] if not (isinstance(i, dict) and i.get("name") == name)]
        removed = removed or len(items) != len(config.get(section) or [])
        config[section] = items
    if config.get("current-context") == name:
        config["current-context"] = ""
    if removed:
        _write_atomically(target, config, target.stat().st_mode & 0o777)
    return removed


def _write_atomically(target: Path, config: dict[str, Any], mode: int) -> None:
    _write_text_atomically(target, yaml.safe_dump(config, default_flow_style=False, sort_keys=False), mode)


def _write_text_atomically(target: Path, text: str, mode: int) -> None:
    """Replace the file's content at once (a temp file beside it, renamed over it). A symlinked kubeconfig
    (dotfiles kept elsewhere) stays a link: the file it points to is the one replaced, even when it is not
    there yet."""
    target = Path(os.path.realpath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def _upsert(config: dict[str, Any], section: str, entry: dict[str, Any]) -> None:
    """Replace ours where it stands (a re-run leaves the file byte-identical), else append it."""
    items = list(config.get(section) or [])
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("name") == entry["name"]:
            items[i] = entry
            break
    else:
        items.append(entry)
    config[section] = items
