"""Loaded by every Python an aws test starts (``PYTHONPATH``): the same network guard as in the test."""

import importlib.util
import os

if os.environ.get("NETGUARD_TEST_LOG"):
    _path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "netguard.py")
    _spec = importlib.util.spec_from_file_location("rtui_test_netguard", _path)
    if _spec is not None and _spec.loader is not None:
        _guard = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_guard)
        _guard.install([])
