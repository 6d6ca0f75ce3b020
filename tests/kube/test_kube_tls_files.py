"""A kubeconfig's certificate and key data never land in /tmp (issue 37; no secrets in files).

The official client writes ``certificate-authority-data``, ``client-certificate-data`` and
``client-key-data`` to files, since the TLS stack loads them by path: ``tempfile.mkstemp`` in the
system temp dir unless its loader is given ``temp_file_path``, removed by an ``atexit`` hook
(kubernetes/config/kube_config.py, ``_create_temp_file_with_content``). An rtui killed mid-run (a
SIGKILL, a crash, the laptop's battery) runs no hook: the clean-clone suite, which kills `rtui up` at
every boundary, found its CA files left in /tmp. rtui has the client write them in a 0700 dir of its
own cache instead.
"""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path

import pytest
from kubernetes.config import kube_config

from targets.kube.api import KubeApi

KEY = b"-----BEGIN PRIVATE KEY-----\nnot-a-real-key\n-----END PRIVATE KEY-----\n"
CERT = b"-----BEGIN CERTIFICATE-----\nnot-a-real-cert\n-----END CERTIFICATE-----\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _kubeconfig(path: Path) -> Path:
    path.write_text(f"""apiVersion: v1
kind: Config
current-context: c
clusters:
- name: k
  cluster: {{server: "https://127.0.0.1:9", certificate-authority-data: "{b64(CERT)}"}}
users:
- name: u
  user: {{client-certificate-data: "{b64(CERT + b'#client')}", client-key-data: "{b64(KEY)}"}}
contexts:
- name: c
  context: {{cluster: k, user: u}}
""")
    return path


def test_certificate_and_key_data_are_written_in_rtuis_private_dir_not_tmp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("RTUI_CACHE_DIR", str(cache))
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))  # where mkstemp(dir=None) writes
    monkeypatch.setattr(kube_config, "_temp_files", {})
    KubeApi.from_kubeconfig(str(_kubeconfig(tmp_path / "kubeconfig")))
    written = [Path(p) for p in kube_config._temp_files.values()]
    assert len(written) == 3, written  # the CA, the client certificate, the key
    assert not list(system_tmp.iterdir()), "the client wrote certificate data in the system temp dir"
    folders = {p.parent for p in written}
    assert len(folders) == 1 and cache in next(iter(folders)).parents, folders
    assert next(iter(folders)).stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in written)
    assert KEY in [p.read_bytes() for p in written]
    for p in written:  # what the atexit hook would have done
        os.remove(p)
