"""The EKS cluster CA rtui hands its HTTP client is the one EKS reports, never a file found under the
expected name (issue 33, item 6).

``targets.aws.eks_api._remember_eks`` reads the CA from DescribeCluster (``cluster.certificateAuthority.data``,
base64 PEM: EKS API reference, DescribeCluster / Certificate) and gives the Kubernetes client a file
holding it (``ssl_ca_cert``: the client verifies the API server against that file and no other, then
sends the EKS bearer token). The cache named the file by a hash of the CA and, when a file of that
name existed, used it unread: a file planted there (the cache dir was made with the default umask,
0755, its files 0644) made rtui trust whatever CA the planter chose, and so send its token to them.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from pathlib import Path

import pytest

from backend.errors import UserError
from targets.aws import eks

EKS_CA = b"-----BEGIN CERTIFICATE-----\nTUlJQyBla3MgY2x1c3RlciBDQQ==\n-----END CERTIFICATE-----\n"
PLANTED = b"-----BEGIN CERTIFICATE-----\nTUlJQyBhdHRhY2tlciBDQQ==\n-----END CERTIFICATE-----\n"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("RTUI_CACHE_DIR", str(root))
    return root


def expected_name(cache: Path) -> Path:
    """Where the cache kept a CA: named by the hash of its content."""
    return cache / "eks" / f"{hashlib.sha256(EKS_CA).hexdigest()[:16]}.pem"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_fresh_cache_holds_the_ca_in_a_0600_file_in_a_0700_dir(cache: Path) -> None:
    path = Path(eks.ca_file(base64.b64encode(EKS_CA).decode()))
    assert path.read_bytes() == EKS_CA
    assert mode_of(path) == 0o600 and mode_of(path.parent) == 0o700


def test_a_planted_ca_under_the_expected_name_is_not_trusted(cache: Path) -> None:
    planted = expected_name(cache)
    planted.parent.mkdir(parents=True)
    planted.write_bytes(PLANTED)
    path = Path(eks.ca_file(base64.b64encode(EKS_CA).decode()))
    assert path.read_bytes() == EKS_CA  # what EKS reported, not what was found there
    assert mode_of(path) == 0o600 and mode_of(path.parent) == 0o700


def test_a_symlink_planted_under_the_expected_name_is_replaced_not_followed(cache: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "attacker.pem"
    elsewhere.write_bytes(PLANTED)
    planted = expected_name(cache)
    planted.parent.mkdir(parents=True)
    planted.symlink_to(elsewhere)
    path = Path(eks.ca_file(base64.b64encode(EKS_CA).decode()))
    assert not path.is_symlink() and path.read_bytes() == EKS_CA
    assert elsewhere.read_bytes() == PLANTED  # the link's target was not written through


@pytest.mark.skipif(os.geteuid() != 0, reason="making a dir another uid owns needs root")
def test_a_ca_dir_another_user_owns_is_refused(cache: Path) -> None:
    (cache / "eks").mkdir(parents=True, mode=0o700)
    os.chown(cache / "eks", 65534, 65534)
    with pytest.raises(UserError) as refused:
        eks.ca_file(base64.b64encode(EKS_CA).decode())
    assert "belongs to another user" in refused.value.message and refused.value.remedy
