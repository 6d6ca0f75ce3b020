"""moto's server in a process of its own, over real HTTP on a free loopback port.

Its own process because moto's backends (and its authentication switch) are process-wide: a server
inside the test process would share them with every other moto test there.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from tests.eventually import eventually


@contextmanager
def moto_server_process(start_timeout_s: float = 60.0) -> Iterator[str]:
    """Yields the server's endpoint once it answers; stops the server on the way out."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        def answering() -> bool:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=2).read()
            except OSError:
                if server.poll() is not None:  # it died: say why now, not at the deadline
                    raise
                return False
            return True

        eventually(f"the moto server at {endpoint} to answer", answering, start_timeout_s, interval=0.1)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)
