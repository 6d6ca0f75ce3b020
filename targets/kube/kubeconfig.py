"""The user's kubeconfig, read as kubectl reads it: which files (``--kubeconfig``, ``KUBECONFIG``,
``~/.kube/config``), the first file naming an entry winning, its contexts for the picker, and where the
client must route like kubectl. Reads files only: no credentials are loaded and no server is contacted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes.client import Configuration
from kubernetes.config.config_exception import ConfigException

from backend.errors import UserError

Obj = dict[str, Any]
CONFIG_ERRORS = (ConfigException, yaml.YAMLError, ValueError, TypeError, KeyError, AttributeError, OSError)


def one_line(err: object) -> str:
    return " ".join(str(err).split())[:300]


def kubeconfig_entry(files: list[str], section: str, name: str) -> Obj:
    """The kubeconfig's ``section`` ("clusters", "users") entry of that name, the first file naming it
    winning (as kubectl merges)."""
    key = section.removesuffix("s")  # the entry's body: "cluster", "user"
    for file in files:
        try:
            with open(file) as f:
                doc = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            continue
        for item in (doc.get(section) or []) if isinstance(doc, dict) else []:
            if isinstance(item, dict) and str(item.get("name")) == name:
                return dict(item.get(key) or {})
    return {}


def cluster_entry(files: list[str], name: str) -> Obj:
    return kubeconfig_entry(files, "clusters", name)


def user_entry(files: list[str], name: str) -> Obj:
    return kubeconfig_entry(files, "users", name)


def route_like_kubectl(configuration: Configuration, cluster: Obj) -> None:
    """Make the client route like kubectl (client-go) where the two differ.

    - A ``proxy-url`` in the kubeconfig is used for every request to that cluster: client-go's
      ``transport/cache.go`` takes ``Config.Proxy`` as it is and applies NO_PROXY only to the
      environment's proxy (``utilnet.NewProxierWithNoProxyCIDR(http.ProxyFromEnvironment)``); the
      Python client would let NO_PROXY bypass it.
    - ``socks5://`` resolves the server's name at the proxy: Go's ``net/http`` (transport.go) hands
      the SOCKS5 dialer the unresolved ``host:port``. urllib3 (PySocks) resolves locally unless the
      scheme is ``socks5h``, which fails for a name only the far side knows (a bastion's DNS).
    """
    if cluster.get("proxy-url"):
        configuration.no_proxy = ""
    proxy = str(configuration.proxy or "")
    if proxy.lower().startswith("socks5://"):
        configuration.proxy = "socks5h://" + proxy[len("socks5://"):]


def first_current_context(files: list[str]) -> str | None:
    """kubectl takes the first file's current-context; the client's merger takes the last one's."""
    for name in files:
        try:
            with open(name) as f:
                doc = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict) and doc.get("current-context"):
            return str(doc["current-context"])
    return None


def kubeconfig_files(path: str | None) -> tuple[str, list[str]]:
    """The kubeconfig source as kubectl picks it (flag, KUBECONFIG, ~/.kube/config) and its files."""
    source = path or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    files = [os.path.expanduser(p) for p in source.split(os.pathsep) if p]
    if not any(os.path.isfile(f) for f in files):
        raise UserError(
            f"no kubeconfig found (looked in {', '.join(files) or source})",
            remedy="pass --kubeconfig PATH, run `aws eks update-kubeconfig --name CLUSTER`, or use --target local",
        )
    return source, files


@dataclass(frozen=True)
class KubeContext:
    """One kubeconfig context as a picker shows it."""

    name: str
    cluster: str
    server: str  # empty when no cluster entry of that name exists
    namespace: str


def kube_contexts(path: str | None = None) -> tuple[list[KubeContext], str | None]:
    """The kubeconfig's contexts and its current one, merged like kubectl (the first file naming one wins).

    Reads the files only: no credentials are loaded and no server is contacted.
    """
    _, files = kubeconfig_files(path)
    servers: dict[str, str] = {}
    entries: dict[str, Obj] = {}
    current: str | None = None
    for name in (f for f in files if os.path.isfile(f)):
        try:
            with open(name) as f:
                doc = yaml.safe_load(f)
            if not isinstance(doc, dict):
                raise ValueError("not a kubeconfig (empty, or not a mapping)")
            for item in doc.get("clusters") or []:
                servers.setdefault(str(item["name"]), str((item.get("cluster") or {}).get("server") or ""))
            for item in doc.get("contexts") or []:
                entries.setdefault(str(item["name"]), dict(item.get("context") or {}))
            current = current or (str(doc["current-context"]) if doc.get("current-context") else None)
        except CONFIG_ERRORS as err:
            raise UserError(f"the kubeconfig {name} is malformed: {one_line(err)}",
                            remedy="fix it or point --kubeconfig at another file") from err
    contexts = [KubeContext(name, str(entry.get("cluster") or ""), servers.get(str(entry.get("cluster")), ""),
                            str(entry.get("namespace") or "default")) for name, entry in entries.items()]
    return contexts, current
