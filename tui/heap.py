"""The wizard's modules load with Python's cyclic garbage collector paused, then stay out of its way.

Loading the wizard (Textual, pydantic, the backend, the screens) makes some 50,000 objects that
live as long as the process, and next to no garbage. Left to the collector, every full collection
walks all of them again: a log flood on the dashboard makes enough long-lived containers to trigger
one every second or so, and each held the event loop for 60-80 ms, which was the flood's p99 lag
(bench/tui_flood.py, ``--collector-as-is`` for the baseline). ``gc.freeze()`` moves what is loaded
to the permanent generation, which no collection walks: the p99 went to 16-18 ms. (Pausing the
collector while the modules load is worth 0-8 ms of the first frame, within that bench's noise.)

Only the process's owner calls ``loading``: the wizard (``tui.cli``), never a library import, so a
test process importing ``tui`` keeps its collector as it was. What loads later (the run screen and
its modules, when first shown) is frozen by ``settle`` once the dashboard is up, again only in a
process whose owner called ``loading``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_owned = False  # loading() ran: this process is rtui's own (the wizard's), not a host's such as pytest's


@contextmanager
def loading() -> Iterator[None]:
    """No collection while the block imports; then what it loaded (and everything before) is frozen."""
    global _owned
    _owned = True
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def settle() -> None:
    """Freeze what is alive now (modules loaded since, a long-lived screen), where ``loading`` ran."""
    if _owned:
        gc.freeze()
