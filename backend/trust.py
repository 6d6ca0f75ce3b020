"""What a rtui.toml found in the working directory may decide, and which variables a job may get.

A checked-out repository can carry a ``rtui.toml``: running rtui there must not ship the user's
cloud keys to a cluster, run an image the user never chose or read a file the user never named.
So the fields that choose what runs, what is read or where results go are taken from
``./rtui.toml`` only once the user has confirmed that file's content (``rtui config trust`` or
the wizard's modal); the confirmation is its sha256, remembered per path in the state dir, so any
change asks again. The user's own config dir file, ``--config FILE``, ``RTUI_*`` and flags are the
user's words and are trusted as they are.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from backend.paths import state_dir

# The fields that choose what runs (image, CRDs), what is read (token file, kubeconfig with its exec
# plugins, the environment passed on) or where results go (storage_path may be an s3:// bucket).
GUARDED_FIELDS: tuple[str, ...] = ("image", "addon_registry", "kuberay_crds", "hf_token", "job_env", "kubeconfig",
                                   "storage_path")

TRUST_COMMAND = "rtui config trust"
_TRUST_FILE = "trusted-config.json"

# Variables a training job legitimately needs although their names look like credentials.
JOB_SECRETS = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY"})
# Credentials of the user's clouds, clusters, forges and agents: never passed to a job, from any source.
_CREDENTIAL = re.compile(
    r"(AWS|AZURE|ARM|GOOGLE|GCLOUD|CLOUDSDK|GCP|OCI|ALIBABA_CLOUD|ALICLOUD|DIGITALOCEAN|IBMCLOUD|KUBE|VAULT|SSH"
    r"|GPG|DOCKER|NPM|TWINE|GH|GITHUB|GITLAB)(_.*)?"
    r"|KUBECONFIG|NETRC"
    r"|.*(SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE_KEY).*"
    r"|.*_(TOKEN|API_KEY|ACCESS_KEY|KEY_ID|AUTH)",
    re.IGNORECASE,
)


def credential_names(names: tuple[str, ...] | list[str]) -> list[str]:
    """The names among ``names`` that look like a credential and are not a job's own secret."""
    return [n for n in names if n.upper() not in JOB_SECRETS and _CREDENTIAL.fullmatch(n)]


@dataclass(frozen=True)
class UnconfirmedFile:
    """A ./rtui.toml whose guarded fields the user has not confirmed in this content."""

    path: Path
    sha256: str
    values: dict[str, object]  # guarded field -> the file's value

    def describe(self) -> str:
        return ", ".join(f"{k}={json.dumps(v)}" for k, v in self.values.items())


def digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def _trust_path() -> Path:
    return state_dir() / _TRUST_FILE


def _trusted() -> dict[str, str]:
    try:
        data = json.loads(_trust_path().read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def is_trusted(path: Path, sha256: str) -> bool:
    return _trusted().get(str(path.resolve())) == sha256


def remember(path: Path, sha256: str) -> None:
    """Record that the user confirmed ``path`` in the content whose hash is ``sha256`` (0600, atomic)."""
    trusted = _trusted()
    trusted[str(path.resolve())] = sha256
    target = _trust_path()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".trusted-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(trusted, f, indent=1, sort_keys=True)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
