"""``rtui check --target aws``: the preflight matrix as text or one JSON object, and an exit code.

Exit codes: 0 at least one AZ is feasible, 3 none is, 2 bad input, 1 an AWS failure. Errors
are one line on stderr; progress goes to stderr too, so stdout stays clean for ``--json``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TextIO

from backend.aws.preflight import run_preflight
from backend.aws.quota import increase_command
from backend.aws.report import PreflightReport, PreflightRequest, RegionReport
from backend.errors import OperationError, RtuiError

EXIT_FEASIBLE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NONE_FEASIBLE = 0, 1, 2, 3


def check_command(request: PreflightRequest, *, as_json: bool, stdout: TextIO, stderr: TextIO) -> int:
    started = time.perf_counter()
    done: list[str] = []

    def progress(region: RegionReport) -> None:
        done.append(region.region)
        # Progress only where a person watches: a TTY stderr. Scripts get a quiet stderr.
        if _is_tty(stderr):
            state = _region_state(region)
            stderr.write(f"[{len(done)}] {region.region}: {state} ({time.perf_counter() - started:.1f}s)\n")
            stderr.flush()

    try:
        report = asyncio.run(run_preflight(request, on_region=progress))
    except RtuiError as err:
        stderr.write(f"rtui check: {err}\n")
        return err.exit_code
    except Exception as exc:  # a bug or an unexpected library failure: still one line
        stderr.write(f"rtui check: {OperationError(f'unexpected error: {type(exc).__name__}: {exc}')}\n")
        return EXIT_FAILED

    if as_json:
        stdout.write(json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
    else:
        stdout.write(render_text(report))
    return EXIT_FEASIBLE if report.recommendation is not None else EXIT_NONE_FEASIBLE


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
        price = f", ${rec.price_per_hour:.2f}/h" if rec.price_per_hour is not None else ""
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
    if region.zones:
        out.append(f"  {'zone':<16}{'zone id':<12}{'gpu':<5}{'sys':<5}{'efa':<5}{'eks':<5}{'res':<5}verdict")
    for zone in region.zones:
        reserved = sum(r.available for r in zone.reservations if r.usable)
        notes = zone.reasons or zone.warnings
        verdict = zone.verdict + (": " + "; ".join(notes) if notes else "")
        out.append(
            f"  {zone.zone:<16}{zone.zone_id:<12}{_yn(zone.gpu_offered):<5}{_yn(zone.system_offered):<5}"
            f"{(str(zone.efa_interfaces) if zone.efa else 'no'):<5}{_yn(zone.eks_supported):<5}"
            f"{reserved:<5}{verdict}"
        )
    out.extend(f"  ! {reason}" for reason in region.reasons)
    return out


def _yn(value: bool) -> str:
    return "yes" if value else "no"
