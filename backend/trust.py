"""What a rtui.toml that came with a checkout may decide, and which variables a job may get.

A checked-out repository can carry a ``rtui.toml``: running rtui there must not run code the user
never chose, read or ship what the user never named, send results elsewhere, reach another cluster or
account, open anything wider or act on someone else's resources. So the rule is an allowlist:
such a file sets only the knobs of ``FREE_FIELDS`` on its own; every field of ``HELD_FIELDS`` is
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

# Fields a checkout's rtui.toml may set without confirmation: how long and how the job trains, how
# the model is sharded, how rtui waits and shows. None of them chooses what runs, what is read, where
# results go, who is reached, how open anything is or which existing resources are acted on. A new
# RunConfig field is on neither list until someone decides (tests/test_config_allowlist.py fails).
FREE_FIELDS: frozenset[str] = frozenset({
    "availability_zone",  # which AZ of the region the user chose; the plan checks it
    "gpus_per_node", "kube_timeout_s", "kube_stream_idle_s", "aws_timeout_s", "idle_minutes",
    "steps", "seq_len", "batch_size", "learning_rate", "num_workers", "precision", "text_field", "shard",
    "shard_size", "reduce_dtype", "reshard_after_forward", "optimizer", "tokens_per_step",
    "activation_checkpointing", "compile", "checkpoint_every", "export_every", "require_transport",
    "max_failures",  # how often a dead worker's group restarts; from rtui's own checkpoints only
    "lr_schedule", "warmup_steps", "weight_decay", "max_grad_norm", "seed", "eval_tokens",  # how it trains
    "keep_checkpoints",  # how many of the run's own checkpoints stay; never where they go
    "local_cpus", "local_hidden_size", "local_layers", "local_heads", "local_vocab_size",
})

# Every other field, with why a file that came with a checkout may not set it on its own (one line
# each: `rtui config show` and the wizard's modal print it beside the file's value).
HELD_FIELDS: dict[str, str] = {
    "target": "chooses where the run goes: this machine, an AWS account or a kubeconfig cluster",
    "cluster_name": "names the existing cluster and resources that up, status and down act on",
    "region": "chooses the AWS region whose resources are created and torn down",
    "profile": "chooses which AWS credentials (and so which account) rtui uses",
    "kubernetes_version": "chooses the Kubernetes version the new EKS cluster runs",
    "vpc_id": "adopts an existing VPC: rtui builds into someone's network",
    "private_subnet_ids": "adopts existing subnets: rtui builds into someone's network",
    "api_cidrs": "chooses who may reach the EKS API endpoint (0.0.0.0/0 is everyone)",
    "access_scope": "chooses what your EKS access entry grants",
    "system_node_type": "chooses the machines created and billed by the hour",
    "system_node_count": "chooses how many machines are created and billed by the hour",
    "gpu_node_type": "chooses the machines created and billed by the hour",
    "gpu_node_count": "chooses how many machines are created and billed by the hour",
    "spot": "chooses how the GPU machines are bought: Spot ones AWS may take back mid-run",
    "spot_types": "chooses which machines are created and billed by the hour",
    "spot_fallback": "chooses to buy the GPU machines On-Demand, at the full price, when Spot has none",
    "namespace": "chooses the existing namespace whose objects rtui creates, changes and deletes",
    "image": "chooses the container image every Ray pod runs",
    "kuberay_version": "chooses the KubeRay operator release installed and run",
    "ray_version": "chooses the Ray release the cluster runs",
    "nvidia_device_plugin_version": "chooses the NVIDIA device plugin release run on every GPU node",
    "efa_device_plugin_version": "chooses the EFA device plugin release run on every GPU node",
    "allow_unpinned": "runs images whose digest nobody checked",
    "addon_registry": "chooses where the add-on images (run with node rights) are pulled from",
    "operator_scope": "cluster lets the operator read secrets and pods of every namespace",
    "kuberay_crds": "chooses where the CRDs installed into the cluster come from",
    "kubeconfig": "chooses the kubeconfig read, and the exec plugins in it that rtui runs",
    "context": "chooses which cluster and credentials of the kubeconfig are used",
    "hf_token": "chooses the file or variable read and shipped to the cluster as a Secret",
    "storage_size": "creates a volume in the cluster (billed) and sends the results there",
    "service_account": "chooses the credentials the Ray pods get",
    "model_id": "chooses the model downloaded or read from disk, and run",
    "model_revision": "chooses the commit of the model that is downloaded and run",
    "data": "chooses the file or bucket the job reads",
    "tokenizer": "chooses the tokenizer downloaded or read from disk",
    "storage_path": "chooses where checkpoints and the model are written (a bucket may be anyone's)",
    "resume_from": "chooses the checkpoint every worker loads (a checkpoint can carry a pickle)",
    "job_env": "chooses which of your environment variables reach the job",
    "local_worker_nodes": "starts more Ray processes on this machine, each listening on ports",
    "local_dashboard_port": "chooses a fixed port this machine listens on",
}

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


def held_reason(field: str) -> str:
    """Why a checkout's file may not set ``field`` on its own; an unclassified field is held too."""
    if field in FREE_FIELDS:  # listed only when it does not fit the defaults of the held ones
        return "waits with the file's held fields: it does not fit their defaults"
    return HELD_FIELDS.get(field, "not on the allowlist of fields a checkout's file may set")


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
