"""The aws target's part of the first screen: the region/AZ feasibility matrix.

It fills in as the preflight returns, one region at a time (the aws layer's ``MatrixWatch``
posts each region): the AZ in use is highlighted, choosing another posts
``Reconfigure`` and the App makes a session with that availability zone. A short quota offers the
increase request; the App asks for confirmation (``ConfirmAsked``, this target's modal), then this
panel files it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.binding import Binding
from textual.widget import Widget

from backend.resources import CheckResult, CheckStatus
from targets.aws.config import AwsConfig
from targets.aws.matrix import FeasibilityPanel
from targets.aws.quota_modal import ConfirmQuotaIncrease
from tui.target_panel import ConfirmAsked, PanelUpdated, Reconfigure, TargetPanel

if TYPE_CHECKING:
    from targets.aws.cloud import PreflightReport, QuotaIncreaseRequest
    from targets.aws.cloud.report import QuotaStatus, RegionReport
    from targets.aws.infra.layer import AwsLayer

# Checks whose failure leaves the matrix empty: the matrix box says them, with their remedy.
MATRIX_FAILURES = frozenset({"aws.preflight", "aws.azs"})


@dataclass
class RegionsListed(PanelUpdated):
    """The regions the matrix is about to check."""


@dataclass
class RegionChecked(PanelUpdated):
    """One region's checks returned."""


@dataclass
class QuotaRequested(PanelUpdated):
    """The quota increase requests were filed."""


class MatrixPanel(TargetPanel):
    bindings = (
        Binding("z", "panel('pick_zone')", "AZ", id="zone",
                tooltip="Choose the availability zone (Enter on another feasible one uses it)"),
        Binding("a", "panel('all_regions')", "All regions", id="all_regions",
                tooltip="Check every enabled region, not only the configured one (again: only that one)"),
        Binding("i", "panel('request_quota')", "Quota increase", id="quota_increase",
                tooltip="Ask AWS for the vCPU quota this plan is short of (asks to confirm first)"),
    )
    pickers = frozenset({"matrix"})
    compact = True
    report: PreflightReport | None = None  # the finished matrix
    all_regions = False


    @property
    def config(self) -> AwsConfig:
        return AwsConfig.of(self.screen.session.config)

    def above(self) -> Iterable[Widget]:
        cfg = self.config
        yield FeasibilityPanel(gpus=f"{cfg.gpu_node_count} × {cfg.gpu_node_type}", region=cfg.region,
                               chosen=(cfg.region, cfg.availability_zone) if cfg.availability_zone else None)

    def feasibility(self) -> FeasibilityPanel:
        return self.screen.query_one(FeasibilityPanel)

    def layer(self) -> AwsLayer | None:
        # lazy: boto3 (~400 ms) after the first frame: the matrix paints before the preflight needs the aws layer
        from targets.aws.infra.layer import AwsLayer

        return next((x for x in self.screen.session.stack.layers if isinstance(x, AwsLayer)), None)

    def config_rows(self) -> list[tuple[str, str]]:
        cfg = self.config
        return [("region", cfg.region), ("GPU nodes", f"{cfg.gpu_node_count} × {cfg.gpu_node_type}"),
                ("AZ", cfg.availability_zone or "the recommended one")]

    def mounted(self) -> Widget | None:
        self.feasibility().reset(all_regions=self.all_regions)
        return self.feasibility().matrix  # the AZ is the one choice left to make here

    def before_checks(self) -> None:
        # lazy: boto3 (~400 ms) after the first frame: the matrix paints before the preflight needs the aws layer
        from targets.aws.infra.layer import MatrixWatch

        layer = self.layer()
        if layer is None:
            return
        screen = self.screen

        def listed(names: list[str]) -> None:
            screen.post_message(RegionsListed(lambda: self.feasibility().listed(names)))

        def checked(region: RegionReport) -> None:
            screen.post_message(RegionChecked(lambda: self.feasibility().checked(region)))

        layer.watch = MatrixWatch(on_listed=listed, on_region=checked, all_regions=self.all_regions)

    def takes_failure(self) -> tuple[str, str] | None:
        # The matrix says it (once: no notification too); Enter is refused with this line.
        return ("aws.preflight", "AWS preflight") if self.layer() is not None else None

    def checks_finished(self, results: list[CheckResult]) -> list[CheckResult]:
        layer = self.layer()
        self.report = layer.report if layer is not None else None
        # The matrix shows the regions, and what stopped it from filling (with what to do): the checks
        # box does not say it again.
        stopped = next((c for c in results if c.id in MATRIX_FAILURES and c.status is CheckStatus.FAIL), None)
        failed = None if stopped is None else stopped.detail + (f" — {stopped.remedy}" if stopped.remedy else "")
        self.feasibility().finished(self.report, failed)
        return [c for c in results if not c.id.startswith("aws.region.") and c is not stopped]

    def rechecking(self) -> None:
        self.report = None
        self.feasibility().reset(all_regions=self.all_regions)

    def short_quotas(self) -> list[tuple[str, QuotaStatus]]:
        """The short quotas of the highlighted AZ's region (else the configured one), once the matrix is in."""
        if self.report is None:
            return []
        # lazy: boto3 (~400 ms) after the first frame: the matrix paints before the preflight needs the aws layer
        from targets.aws.cloud.quota_requests import short_quotas

        region = self.feasibility().highlighted_region
        short = short_quotas(self.report.regions)
        return [s for s in short if s[0] == region] or [s for s in short if s[0] == self.config.region]

    def enabled(self, action: str) -> bool:
        if action == "request_quota":
            return not self.screen.wizard.read_only and bool(self.short_quotas())
        return True

    def enter_picks(self, list_id: str, option_id: str) -> bool:
        return not self.feasibility().is_in_use(option_id)

    def choose(self, list_id: str, option_id: str) -> bool:
        if self.feasibility().is_in_use(option_id):
            return False
        region, zone = option_id.split("/", 1)
        cfg = self.config
        if (region, zone) == (cfg.region, cfg.availability_zone):
            return False
        self.screen.post_message(Reconfigure({"region": region, "availability_zone": zone},
                                             cfg.availability_zone or cfg.region,
                                             "or start rtui with --availability-zone"))
        return True

    def act(self, action: str) -> None:
        if action == "pick_zone":
            self.feasibility().matrix.focus()
        elif action == "all_regions":
            self.all_regions = not self.all_regions
            self.screen.action_recheck()
        elif action == "request_quota":
            requests = self.short_quotas()
            if requests:  # of one region: the App files them once the user confirms
                region = requests[0][0]
                self.screen.post_message(ConfirmAsked(ConfirmQuotaIncrease(requests),
                                                      then=lambda: self.file_quota_increase(region)))

    def file_quota_increase(self, region: str) -> None:
        """After the App's confirmation: the same request `rtui check --request-quota-increase --yes` files."""
        self.screen.run_worker(self._file(region), exclusive=True, group="quota", exit_on_error=False)

    async def _file(self, region: str) -> None:
        # lazy: boto3 (~400 ms) after the first frame: the matrix paints before the preflight needs the aws layer
        from targets.aws.cloud.quota_requests import request_missing_quota
        from targets.aws.infra.preflight_request import preflight_request

        request = preflight_request(self.screen.session.ctx).model_copy(update={"regions": [region]})
        filed = await request_missing_quota(request)  # a failure: RtuiScreen says it in one notification
        self.screen.post_message(QuotaRequested(lambda: self.quota_requested(filed)))

    def quota_requested(self, filed: list[QuotaIncreaseRequest]) -> None:
        if not filed:
            self.screen.notify("No quota is short for this plan: nothing was requested.")
        for r in filed:
            self.screen.notify(f"requested {r.quota_code} = {r.desired_value:g} vCPUs in {r.region}: {r.status}"
                               + (f" (case {r.case_id})" if r.case_id else ""), title="Quota increase", timeout=10)
