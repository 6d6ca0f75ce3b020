"""What closes the run's Ray cluster: its auth token as a Secret of the run.

Ray 2.58 in token mode (``RAY_AUTH_MODE=token``) takes no request to its dashboard, Jobs API or
GCS without the token. rtui makes the token when it applies the Secret, keeps it nowhere else (not
in the record, the ledger or a log) and reads it back from the cluster whenever it talks to Ray,
with the kubeconfig's credentials: whoever can read Secrets in the namespace can use the cluster.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from backend.layers.base import Context
from backend.layers.kubernetes import manifests
from backend.layers.kubernetes.handlers import LAYER, NAMESPACE, KubeHandler, delete_ours, object_id, ours
from backend.model import Action, Observed, Resource
from backend.runner import Progress

if TYPE_CHECKING:
    from backend.config import RunConfig
    from backend.layers.kubernetes.access import KubeApi

RAY_TOKEN = "k8s.secret.ray-token"
# 32 random bytes, as KubeRay's own generated Secret holds (raycluster_controller.go generateRandomToken(32)).
TOKEN_BYTES = 32


def secret_value(secret: manifests.Manifest | None, key: str) -> str | None:
    """A key of a Secret as the API server returns it (``data``, base64); None when absent or unreadable."""
    raw = ((secret or {}).get("data") or {}).get(key)
    if not raw:
        return None
    try:
        return base64.b64decode(raw, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


async def ray_token(api: KubeApi, config: RunConfig, run_id: str) -> str | None:
    """The run's Ray token from its Secret; None when there is none of this run's."""
    live = await api.get("v1", "Secret", manifests.ray_token_secret_name(config), config.namespace)
    if live is None or not ours(live, run_id):
        return None
    return secret_value(live, manifests.RAY_TOKEN_KEY)


class RayTokenHandler(KubeHandler):
    kind = "k8s-ray-token"
    title = "Store the Ray cluster's auth token as a Secret"
    expected_s = 1.0

    async def observe(self, api: KubeApi, ctx: Context) -> Observed | None:
        name = manifests.ray_token_secret_name(ctx.config)
        live = await api.get("v1", "Secret", name, ctx.config.namespace)
        if live is None or not ours(live, ctx.record.run_id):
            return None
        usable = secret_value(live, manifests.RAY_TOKEN_KEY) is not None
        return Observed(address=RAY_TOKEN, layer=LAYER, kind=self.kind, id=object_id(live),
                        state={"key": manifests.RAY_TOKEN_KEY}, depends_on=(NAMESPACE,), healthy=usable,
                        reason="exists" if usable else f"no {manifests.RAY_TOKEN_KEY} in it")

    def compare(self, want: Resource, have: Observed) -> tuple[Action, str]:
        # Never a new token under a running cluster: its pods read it once, at start.
        return (Action.NOOP, have.reason) if have.healthy else (Action.REPLACE, have.reason)

    async def create(self, ctx: Context, want: Resource) -> AsyncIterator[Progress]:
        api = self.api(ctx)
        if await ray_token(api, ctx.config, ctx.record.run_id) is None:
            token = secrets.token_urlsafe(TOKEN_BYTES)
            secret = manifests.ray_token_secret(ctx.config, ctx.record.run_id, token)
            await api.apply(secret)
        ctx.ledger.update(want.address, id=f"Secret/{ctx.config.namespace}/"
                                           f"{manifests.ray_token_secret_name(ctx.config)}")
        yield Progress("Ray's auth token stored in the cluster", 1.0)

    async def delete(self, ctx: Context, have: Observed) -> AsyncIterator[Progress]:
        secret = manifests.ray_token_secret(ctx.config, ctx.record.run_id, "")
        async for p in delete_ours(self.api(ctx), ctx, [secret]):
            yield p
