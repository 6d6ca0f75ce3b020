"""``rtui check --target aws``: the preflight matrix as text or one JSON object, and an exit code.

Exit codes: 0 at least one AZ is feasible, 3 none is, 2 bad input, 1 an AWS failure. Errors
are one line on stderr; progress goes to stderr too, so stdout stays clean for ``--json``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import TextIO, TypeVar

from backend.config import clip
from backend.errors import OperationError, RtuiError
from targets.aws.cloud.preflight import run_preflight
from targets.aws.cloud.quota import QuotaIncreaseRequest, increase_command
from targets.aws.cloud.quota_requests import request_missing_quota
from targets.aws.cloud.report import PreflightReport, PreflightRequest, RegionReport
from targets.aws.session import AwsSession

EXIT_FEASIBLE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NONE_FEASIBLE = 0, 1, 2, 3
# The longest an AWS command stays quiet on stderr while it waits (TTY or not): a check that
# gets no answer must not pass for a hung terminal or a stuck CI job.
HEARTBEAT_S = 15.0

T = TypeVar("T")


class Watch:
    """What an AWS command is waiting for, said on stderr after ``every`` seconds of quiet."""

    def __init__(self, stderr: TextIO, every: float, endpoint: Callable[[], str], waiting_for: str) -> None:
        self._stderr = stderr
        self._every = every
        # Both change as the command goes on: the endpoint is the one the awaited calls go to.
        self.endpoint = endpoint
        self.waiting_for = waiting_for
        self.started = self._last_said = time.monotonic()

    def said(self) -> None:
        """Something was just written to stderr: the quiet starts again."""
        self._last_said = time.monotonic()

    async def run(self, work: Awaitable[T]) -> T:
        task = asyncio.ensure_future(work)
        try:
            while True:
                quiet = time.monotonic() - self._last_said
                await asyncio.wait({task}, timeout=max(self._every - quiet, 0.05))
                if task.done():
                    return task.result()
                if time.monotonic() - self._last_said >= self._every:
                    elapsed = time.monotonic() - self.started
                    self._stderr.write(f"rtui: still waiting for AWS at {self.endpoint()}: "
                                       f"{self.waiting_for} ({elapsed:.0f}s)\n")
                    self._stderr.flush()
                    self.said()
        finally:
            task.cancel()


def check_command(
    request: PreflightRequest, *, as_json: bool, stdout: TextIO, stderr: TextIO, heartbeat_s: float = HEARTBEAT_S
) -> int:
    started = time.perf_counter()
    done: list[str] = []
    expected: list[str] = []

    def run(aws: AwsSession, watch: Watch) -> Awaitable[PreflightReport]:
        def waiting() -> None:
            left = [r for r in expected if r not in done]
            if left:
                watch.waiting_for = _pending(left, len(expected))
                watch.endpoint = lambda: aws.endpoint("ec2", left[0])

        def listed(regions: list[str]) -> None:
            expected.extend(regions)
            waiting()

        def progress(region: RegionReport) -> None:
            done.append(region.region)
            waiting()
            # Per-region progress only where a person watches: a TTY stderr. Scripts get a
            # quiet stderr (but for the heartbeat, when a check is slow).
            if _is_tty(stderr):
                state = _region_state(region)
                stderr.write(f"[{len(done)}] {region.region}: {state} ({time.perf_counter() - started:.1f}s)\n")
                stderr.flush()
                watch.said()

        return run_preflight(request, on_region=progress, on_listed=listed, session=aws)

    code, report = _run_aws(request, run, stderr, heartbeat_s)
    if report is None:
        return code
    if as_json:
        stdout.write(json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
    else:
        stdout.write(render_text(report))
    return EXIT_FEASIBLE if report.recommendation is not None else EXIT_NONE_FEASIBLE


def increase_quota_command(
    request: PreflightRequest, *, as_json: bool, stdout: TextIO, stderr: TextIO, heartbeat_s: float = HEARTBEAT_S
) -> int:
    """``rtui check --target aws --request-quota-increase --yes``: file what the plan is short of."""
    def run(aws: AwsSession, watch: Watch) -> Awaitable[list[QuotaIncreaseRequest]]:
        def filing(region: str, code: str) -> None:
            watch.waiting_for = f"requesting quota {code} in {region}"
            watch.endpoint = lambda: aws.endpoint("service-quotas", region)

        return request_missing_quota(request, session=aws, on_request=filing)

    code, filed = _run_aws(request, run, stderr, heartbeat_s)
    if filed is None:
        return code
    if as_json:
        stdout.write(json.dumps({"requests": [r.model_dump(mode="json") for r in filed]}) + "\n")
    elif not filed:
        stdout.write("No quota is short for this plan: nothing was requested.\n")
    for r in filed if not as_json else []:
        stdout.write(f"requested {r.quota_code} = {r.desired_value:g} vCPUs in {r.region}: {r.status}"
                     + (f" (case {r.case_id})" if r.case_id else "") + "\n")
    return 0


def _run_aws(
    request: PreflightRequest,
    work: Callable[[AwsSession, Watch], Awaitable[T]],
    stderr: TextIO,
    heartbeat_s: float,
) -> tuple[int, T | None]:
    """Run one AWS command's work under a ``Watch``; failures become one line on stderr and a code."""
    aws: AwsSession | None = None
    try:
        aws = AwsSession(request.profile)
        session = aws
        watch = Watch(stderr, heartbeat_s, lambda: session.endpoint("ec2", request.default_region),
                      f"listing regions and instance types in {request.default_region}")
        return EXIT_FEASIBLE, asyncio.run(watch.run(work(aws, watch)))
    except RtuiError as err:
        stderr.write(f"rtui: {err}\n")
        return err.exit_code, None
    except Exception as exc:  # a bug or an unexpected library failure: still one line
        stderr.write(f"rtui: {OperationError(f'unexpected error: {type(exc).__name__}: {clip(str(exc), 200)}')}\n")
        return EXIT_FAILED, None
    finally:
        if aws is not None:
            aws.close()


def _pending(left: list[str], total: int) -> str:
    names = ", ".join(left[:4]) + (", …" if len(left) > 4 else "")
    return f"{len(left)} of {total} regions still to answer ({names})"


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _region_state(region: RegionReport) -> str:
    if not region.enabled:
        return "not enabled"
    if not region.reachable:
        return "unreachable"
    if region.error:
        return "error"
    feasible = sum(z.feasible for z in region.zones)
    return f"{feasible}/{len(region.zones)} AZ feasible"


def render_text(report: PreflightReport) -> str:
    lines: list[str] = []
    gpu, system = report.gpu_instance, report.system_instance
    if gpu is not None:
        lines.append(f"GPU nodes: {report.gpu_node_count}× {gpu.instance_type} — {gpu.describe()}")
    if system is not None and report.system_node_count:
        lines.append(
            f"System nodes: {report.system_node_count}× {system.instance_type} — {system.describe()}"
        )
    for region in report.regions:
        lines.append("")
        lines.extend(_render_region(region))
    lines.append("")
    rec = report.recommendation
    if rec is None:
        lines.append("No feasible AZ in the checked regions.")
    else:
        price = f", {rec.price_text()}" if rec.price_per_hour is not None else ""
        lines.append(f"Recommendation: {rec.zone} ({rec.zone_id}) in {rec.region}{price} — {rec.why}")
    return "\n".join(lines) + "\n"


def _render_region(region: RegionReport) -> list[str]:
    head = f"{region.region}: "
    if not region.enabled:
        return [head + f"not enabled ({region.opt_in_status})"]
    if not region.reachable or region.error:
        return [head + ("unreachable — " if not region.reachable else "error — ") + (region.error or "")]
    price = (
        f"${region.price_per_hour:.2f}/h ({region.price_source})"
        if region.price_per_hour is not None
        else "price unknown"
    )
    out = [head + ("feasible" if region.feasible else "not feasible") + f", {price}"]
    if region.spot_interruptions is not None:
        rate = region.spot_interruptions
        out.append(f"  Spot interruptions ({rate.instance_type}, Spot Instance Advisor): {rate.text()}")
    for label, quota in (("GPU quota", region.quota), ("System quota", region.system_quota)):
        if quota is None:
            continue
        if quota.ok is None:
            out.append(f"  {label} {quota.code or '?'}: unknown ({quota.error})")
            continue
        mark = "ok" if quota.ok else f"SHORT by {quota.shortfall}"
        out.append(
            f"  {label} {quota.code}: limit {quota.limit:g}, used {quota.used}, needed {quota.needed}, "
            f"headroom {quota.headroom:g} — {mark}"
        )
        if not quota.ok:
            out.append(f"    ask for {quota.request_value}: {increase_command(region.region, quota)}")
    # A Spot plan costs what each AZ's Spot price makes it: a column of its own (the GPU nodes' price in it).
    by_zone = any(zone.price_per_hour is not None or zone.spot_price is not None for zone in region.zones)
    if region.zones:
        priced = f"{'$/h':<9}{'spot':<8}{'score':<6}{'exp $/h':<9}" if by_zone else ""
        out.append(f"  {'zone':<16}{'zone id':<12}{'gpu':<5}{'sys':<5}{'efa':<5}{'eks':<5}{'res':<5}{priced}verdict")
    for zone in region.zones:
        reserved = sum(r.available for r in zone.reservations if r.usable)
        notes = zone.reasons or zone.warnings
        verdict = zone.verdict + (": " + "; ".join(notes) if notes else "")
        spot = ""
        if by_zone:
            total, each = zone.price_per_hour, zone.spot_price
            spot = f"{'?' if total is None else f'{total:.2f}':<9}{'none' if each is None else f'{each:.4f}':<8}"
            score, expected = zone.spot_score, zone.expected_per_hour
            spot += f"{'?' if score is None else score:<6}{'?' if expected is None else f'{expected:.2f}':<9}"
        out.append(
            f"  {zone.zone:<16}{zone.zone_id:<12}{_yn(zone.gpu_offered):<5}{_yn(zone.system_offered):<5}"
            f"{(str(zone.efa_interfaces) if zone.efa else 'no'):<5}{_yn(zone.eks_supported):<5}"
            f"{reserved:<5}{spot}{verdict}"
        )
    out.extend(f"  ! {reason}" for reason in region.reasons)
    return out


def _yn(value: bool) -> str:
    return "yes" if value else "no"
