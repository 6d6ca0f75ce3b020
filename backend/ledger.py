"""The ledger: what a run created (or adopted), by address, written before the world changes.

``intended`` is saved before the call that creates; ``creating`` once the call went out and
the resource has an id; ``ready`` when it is usable. Teardown writes ``deleting`` then
``deleted``. A crash between a call and its save is healed by discovery (everything we
create carries our marker, tags or labels), never by creating a second one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

# An output a handler sets to False when a resource exists but bills nothing (a nodegroup for which
# AWS launched no instance); the cost meter leaves it out. A new life of the address starts billing again.
BILLING = "billing"


class ResourceStatus(StrEnum):
    INTENDED = "intended"
    CREATING = "creating"
    READY = "ready"
    DELETING = "deleting"
    DELETED = "deleted"
    ADOPTED = "adopted"


class ResourceRecord(BaseModel):
    kind: str
    layer: str = ""  # the layer that owns the address (the teardown summary groups by it)
    id: str | None = None
    status: ResourceStatus = ResourceStatus.INTENDED
    outputs: dict[str, Any] = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)

    @property
    def live(self) -> bool:
        """Created (or on its way) and not deleted: teardown still owes it."""
        return self.status in (ResourceStatus.INTENDED, ResourceStatus.CREATING, ResourceStatus.READY,
                               ResourceStatus.DELETING)

    @property
    def bills(self) -> bool:
        """Live, and not known to bill nothing."""
        return self.live and self.outputs.get(BILLING) is not False


class Ledger:
    """Typed access to ``RunRecord.resources``; every change is saved at once."""

    def __init__(self, resources: dict[str, ResourceRecord], save: Callable[[], None]) -> None:
        self._resources = resources
        self._save = save

    def get(self, address: str) -> ResourceRecord | None:
        return self._resources.get(address)

    def items(self) -> list[tuple[str, ResourceRecord]]:
        return list(self._resources.items())

    def set(self, address: str, kind: str, status: ResourceStatus, *, layer: str = "", id: str | None = None,
            outputs: dict[str, Any] | None = None) -> ResourceRecord:
        now = time.time()
        old = self._resources.get(address)
        if old is not None and (old.status is ResourceStatus.DELETED or status is ResourceStatus.INTENDED):
            old = None  # a new life for this address: nothing of the last one is carried over
        record = ResourceRecord(
            kind=kind, layer=layer or (old.layer if old else ""),
            id=id if id is not None else (old.id if old else None), status=status,
            outputs=outputs if outputs is not None else (dict(old.outputs) if old else {}),
            created_at=old.created_at if old else now, updated_at=now,
        )
        self._resources[address] = record
        self._save()
        return record

    def update(self, address: str, *, status: ResourceStatus | None = None, id: str | None = None,
               outputs: dict[str, Any] | None = None) -> ResourceRecord:
        """Change what is given of an existing entry (outputs are merged)."""
        old = self._resources[address]
        record = old.model_copy(update={
            "status": status or old.status, "id": id if id is not None else old.id,
            "outputs": {**old.outputs, **(outputs or {})}, "updated_at": time.time(),
        })
        self._resources[address] = record
        self._save()
        return record
