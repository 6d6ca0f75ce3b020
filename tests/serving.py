"""A test's HTTP double served from a thread, stoppable at once.

``socketserver.BaseServer.shutdown()`` returns only once ``serve_forever`` next wakes from its select,
which it does every ``poll_interval`` (0.5 s by default): with a double made per test (the Hub double
under every aws test), that was half a second of every teardown, 135 of them in one run of the suite."""

from __future__ import annotations

import socketserver
import threading

# How long shutdown() may wait for the serving thread to notice: a select's timeout, costing nothing idle.
SHUTDOWN_POLL_S = 0.02


def serve_in_thread(server: socketserver.BaseServer, *, name: str | None = None) -> threading.Thread:
    """Start serving ``server`` from a daemon thread; ``server.shutdown()`` then returns within
    ``SHUTDOWN_POLL_S``."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S},
                              name=name, daemon=True)
    thread.start()
    return thread
