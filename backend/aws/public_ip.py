"""The caller's public IPv4 address as AWS sees it, for the EKS API's default allow-list.

AWS answers it at ``https://checkip.amazonaws.com`` (an AWS endpoint, but a plain HTTPS call outside
the SDK): the address the caller's traffic leaves from, which is what the EKS public endpoint sees.
``RTUI_CHECKIP_URL`` points it elsewhere (a proxy, or a mirror inside an air-gapped network).
"""

from __future__ import annotations

import ipaddress
import os
import urllib.error
import urllib.request

from backend.errors import OperationError

CHECKIP_URL = "https://checkip.amazonaws.com"
TIMEOUT_S = 5.0


def checkip_url() -> str:
    return os.environ.get("RTUI_CHECKIP_URL") or CHECKIP_URL


def public_cidr() -> str:
    """``<address>/32`` of the caller, or an OperationError saying how to give the CIDRs instead."""
    url = checkip_url()
    remedy = ("pass --api-cidrs with the public CIDRs you reach AWS from (--api-cidrs 0.0.0.0/0 opens the "
              "API endpoint to everyone)")
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:  # noqa: S310 (https, or the user's own URL)
            text = answer.read(64).decode("ascii", "replace").strip()
    except (OSError, urllib.error.URLError) as exc:
        raise OperationError(f"could not learn your public address from {url} ({exc})", remedy=remedy) from None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise OperationError(f"{url} answered {text[:40]!r}, not an address", remedy=remedy) from None
    if address.version != 4 or not address.is_global:
        raise OperationError(f"{url} answered {address}, not a public IPv4 address", remedy=remedy)
    return f"{address}/32"
