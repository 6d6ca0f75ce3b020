"""The ServiceAccount the Ray pods run as (``--service-account``): how they get credentials on kube.

rtui makes it in the run's namespace (a namespace rtui makes, so no account of the user's can be
there before); the credentials come from the cluster's own mechanism, keyed on its name: on EKS a
Pod Identity association for ``<namespace>/<name>`` made beforehand (``aws eks
create-pod-identity-association``; it may name an account that does not exist yet), whose agent
injects ``AWS_CONTAINER_CREDENTIALS_FULL_URI`` into the pods, which boto3 in the job reads. rtui
never holds or passes the pods' credentials.
"""

from __future__ import annotations

from backend.resources import CheckResult, CheckStatus
from targets.kube.config import KubeConfig


def check(config: KubeConfig) -> CheckResult:
    """What rtui can say about the pods' credentials: not what they may do (it never holds them)."""
    where = f" write {config.storage_path}" if config.storage_path and "://" in config.storage_path else ""
    return CheckResult(
        id="kube.service-account", title="Pods' service account", status=CheckStatus.INFO,
        detail=f"the Ray pods{where or ' run'} as {config.namespace}/{config.service_account}; the storage check "
               "above used your own credentials, not theirs",
        remedy=None if not where else f"give {config.namespace}/{config.service_account} a role that may write there "
                                      "(EKS: aws eks create-pod-identity-association)")
