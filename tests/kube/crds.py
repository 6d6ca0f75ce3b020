"""KubeRay's CRDs for tests: the shared v1.7.0 files, linked (never copied), and a RayService stand-in."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from targets.kube.addons import TRUSTED_CRDS_FILE

if TYPE_CHECKING:
    from tests.kube.conftest import KubeCluster

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "schemas" / "kuberay"


def load_yaml(path: Path) -> dict[str, Any]:
    """A fresh copy of a YAML file's one document, parsed once per process (by libyaml where PyYAML has
    it). KubeRay's CRD files are 0.9 and 1.4 MB: PyYAML's pure-Python loader took ~1 s of CPU for each
    parse, and many tests install them (py-spy: over a third of a kube test module's samples)."""
    stat = path.stat()
    doc: dict[str, Any] = json.loads(_parsed(str(path.resolve()), stat.st_mtime_ns, stat.st_size))
    return doc


@functools.lru_cache(maxsize=16)
def _parsed(path: str, mtime_ns: int, size: int) -> str:
    del mtime_ns, size  # the cache key: a file rewritten in place is read again
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return json.dumps(yaml.load(Path(path).read_text(), Loader=loader))  # a CRD is JSON by definition


def standin_crd(kind: str, *, status: bool = False) -> str:
    """A minimal valid ray.io CRD for ``kind``: served as v1, any spec accepted (``status``: with a status
    subresource, as KubeRay's RayCluster and RayJob have)."""
    plural = kind.lower() + "s"
    subresources = "\n    subresources: {status: {}}" if status else ""
    return f"""\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.ray.io
spec:
  group: ray.io
  names: {{kind: {kind}, listKind: {kind}List, plural: {plural}, singular: {kind.lower()}}}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}{subresources}
"""


# RayService's CRD is not among the shared schemas: a minimal valid one stands in for it.
RAYSERVICE_CRD = standin_crd("RayService")


STANDIN_SHA256 = hashlib.sha256(RAYSERVICE_CRD.encode()).hexdigest()


def vouch_for(path: Path, config: Path | None = None) -> None:
    """List ``path``'s sha256 in an rtui config dir (by default the test's own, tests/conftest.py, never
    the user's), as a user vouches for CRDs of their own."""
    config = config or Path(os.environ["RTUI_CONFIG_DIR"])
    config.mkdir(parents=True, exist_ok=True)
    with (config / TRUSTED_CRDS_FILE).open("a") as out:
        out.write(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n")


def crd_dir(tmp_path: Path, *, vouch: bool = True, config: Path | None = None, shared: Path = SHARED) -> Path:
    """A folder rtui can load the operator's CRDs from (``--kuberay-crds``): the shared v1.7.0 files,
    which match the sha256 rtui ships, and the RayService stand-in, vouched for in the config dir
    (``config``, by default the test's). ``shared``: where the v1.7.0 files are."""
    if not (shared / "ray.io_rayclusters.yaml").is_file():
        pytest.skip(f"KubeRay's CRDs are not at {shared}")
    folder = tmp_path / "crds"
    folder.mkdir()
    for name in ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml"):
        (folder / name).symlink_to(shared / name)
    (folder / "ray.io_rayservices.yaml").write_text(RAYSERVICE_CRD)
    if vouch:
        vouch_for(folder / "ray.io_rayservices.yaml", config)
    return folder


def standin_crd_dir(tmp_path: Path, *, config: Path) -> Path:
    """A folder of stand-ins for all three of KubeRay's CRDs, vouched for in the rtui config dir ``config``:
    what the sandbox installs where the shared v1.7.0 files are not beside the checkout (it never
    downloads them: it runs without a network). They accept any spec; the real schemas are the tests'."""
    folder = tmp_path / "crds"
    folder.mkdir()
    for kind, status in (("RayCluster", True), ("RayJob", True), ("RayService", False)):
        path = folder / f"ray.io_{kind.lower()}s.yaml"
        path.write_text(standin_crd(kind, status=status))
        vouch_for(path, config)
    return folder


def install_shared_crds(cluster: KubeCluster, *files: str) -> list[dict[str, Any]]:
    """Install KubeRay's CRDs from the shared files as someone else would (no rtui labels), Established."""
    if not (SHARED / "ray.io_rayclusters.yaml").is_file():
        pytest.skip(f"KubeRay's CRDs are not at {SHARED}")
    return [cluster.install_crd(load_yaml(SHARED / name))
            for name in files or ("ray.io_rayclusters.yaml",)]
