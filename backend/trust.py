"""What a rtui.toml that came with a checkout may decide, and which variables a job may get.

A checked-out repository can carry a ``rtui.toml``: running rtui there must not run code the user
never chose, read or ship what the user never named, send results elsewhere, reach another cluster or
account, open anything wider or act on someone else's resources. So the rule is an allowlist:
such a file sets only the free knobs on its own (each config model's ``free_fields``: the common ones in
``backend.config.RunConfig``, a target's in its own model); every held field (``held_fields``, with why) is
taken from it only once the user has confirmed that file's content (``rtui config trust`` or the
wizard's modal). The confirmation is its sha256, remembered per path in the state dir, so any change
asks again. A file inside the user's own config dir, ``RTUI_*`` and flags are the user's words and
are trusted as they are; ``--config FILE`` elsewhere is held like ``./rtui.toml``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from backend.paths import state_dir

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


def is_users_own(path: Path, config_dir: Path) -> bool:
    """Whether ``path`` lies in the user's config dir (a link placed there is the user's choice).

    The parent is resolved, not the file: the dir may be a link (dotfiles), the file one the user made."""
    try:
        return path.absolute().parent.resolve().is_relative_to(config_dir.resolve())
    except (OSError, RuntimeError):  # a link loop (RuntimeError before Python 3.13): not the user's dir
        return False


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
