"""Where a run goes: one package per built-in target (``local``, ``kube``, ``aws``), each holding all
of its code (its ``Target``, its layers, its first-screen panel).

The contract and the registry are ``backend.targets`` (nothing in ``backend`` imports this package);
their names are re-exported here for a target written in another package (``targets.Target``).
"""

from backend.targets import (
    BUILTIN,
    DEFAULT,
    ENTRY_POINT_GROUP,
    GPU_SEQ_LEN,
    Defaults,
    FoundCluster,
    Target,
    get,
    known,
    names,
)

__all__ = ["BUILTIN", "DEFAULT", "ENTRY_POINT_GROUP", "GPU_SEQ_LEN", "Defaults", "FoundCluster", "Target", "get",
           "known", "names"]
