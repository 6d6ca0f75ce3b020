"""The caller's public IPv4 address as AWS sees it, for the EKS API's default allow-list.

AWS answers it at ``https://checkip.amazonaws.com`` (an AWS endpoint, but a plain HTTPS call outside
the SDK): the address the caller's traffic leaves from, which is what the EKS public endpoint sees.
``RTUI_CHECKIP_URL`` points it elsewhere (a proxy, or a mirror inside an air-gapped network).
"""

from __future__ import annotations

import ipaddress
import os
import time
import urllib.error
import urllib.request

from backend.errors import OperationError

CHECKIP_URL = "https://checkip.amazonaws.com"
TIMEOUT_S = 5.0
ATTEMPTS = 3  # a dropped packet or a 5xx on hotel Wi-Fi is not a reason to refuse the plan
BACKOFF_S = 0.5  # before the second attempt; doubled before the third


def checkip_url() -> str:
    return os.environ.get("RTUI_CHECKIP_URL") or CHECKIP_URL


def public_cidr() -> str:
    """``<address>/32`` of the caller, or an OperationError saying how to give the CIDRs instead."""
    url = checkip_url()
    remedy = ("pass --api-cidrs with the public CIDRs you reach AWS from (--api-cidrs 0.0.0.0/0 opens the "
              "API endpoint to everyone)")
    text = _ask(url, remedy)
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise OperationError(f"{url} answered {text[:40]!r}, not an address", remedy=remedy) from None
    if address.version != 4 or not address.is_global:
        raise OperationError(f"{url} answered {address}, not a public IPv4 address", remedy=remedy)
    return f"{address}/32"


def _ask(url: str, remedy: str) -> str:
    """The answer's text. A timeout, a refused or dropped connection or a 5xx is asked again (ATTEMPTS in
    all, with a short backoff); a 4xx is final, as asking again will not change it."""
    attempt, delay = 1, BACKOFF_S
    while True:
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:  # noqa: S310 (https, or the user's URL)
                text: str = answer.read(64).decode("ascii", "replace").strip()
                return text
        except (OSError, urllib.error.URLError) as exc:
            final = isinstance(exc, urllib.error.HTTPError) and exc.code < 500
            if final or attempt == ATTEMPTS:
                raise OperationError(f"could not learn your public address from {url} ({exc})",
                                     remedy=remedy) from None
        time.sleep(delay)
        attempt, delay = attempt + 1, delay * 2
