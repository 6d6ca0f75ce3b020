"""First screen: pick the target, see the configuration and the live preflight checks.

On the kube target it also offers the kubeconfig's contexts: choosing another posts
``ContextChosen`` and the App makes a session for that context (and this screen anew, whose
checks then run against the other cluster). The allocatable check is one of those checks.

On aws it shows the feasibility matrix as the preflight fills it in, one region at a time (the
aws layer's ``MatrixWatch`` posts each region as it returns): the AZ in use is highlighted,
choosing another posts ``ZoneChosen`` and the App makes a session with that availability zone.
A short quota offers the increase request; the App asks for confirmation, then this screen files it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Header, OptionList, Static
from textual.widgets.option_list import Option

from backend.errors import RtuiError
from backend.model import CheckResult, CheckStatus
from tui.checks import render_checks, render_config, render_context
from tui.screen import RtuiScreen

if TYPE_CHECKING:
    from backend.aws import PreflightReport, QuotaIncreaseRequest
    from backend.aws.report import QuotaStatus, RegionReport
    from backend.layers.aws.layer import AwsLayer
    from backend.layers.kubernetes.access import KubeContext
    from tui.matrix import FeasibilityPanel

# Checks whose failure leaves the aws matrix empty: the matrix box says them, with their remedy.
MATRIX_FAILURES = frozenset({"aws.preflight", "aws.azs"})

TARGETS = [
    ("local", "Local — a real Ray cluster on this machine: tiny model, no cloud"),
    ("aws", "AWS — new EKS cluster with EFA GPU nodes, in an AZ preflight checks"),
    ("kube", "Kubernetes — an existing cluster from kubeconfig"),
]

def selectable_targets(target: str) -> set[str]:
    """The session's own target: its run, record and lock belong to it (another target is another run)."""
    return {target}


def unselectable_reason(target: str) -> str | None:
    """Why the greyed targets cannot be chosen in a session for ``target`` (None when none is greyed)."""
    others = [name for name, _ in TARGETS if name not in selectable_targets(target)]
    if not others:
        return None
    article = "an" if target[0] in "aeiou" else "a"
    return f"greyed: this is {article} {target} run; use `rtui --target {'|'.join(others)}`"


class TargetScreen(RtuiScreen):
    HELP_TITLE = "the target and its checks"
    # At 24 rows the matrix and the context picker give up rows so the configuration and the checks
    # keep a panel each; a panel whose text is longer scrolls inside itself.
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]
    DEFAULT_CSS = """
    TargetScreen #target-left { width: 1fr; height: 1fr; }
    TargetScreen #target-left #config-box { width: 100%; }
    TargetScreen.-short #target-body { padding: 0 2; }
    TargetScreen.-short #matrix { max-height: 7; }
    TargetScreen.-short #contexts { max-height: 4; }
    TargetScreen #contexts { height: auto; max-height: 8; }
    TargetScreen #contexts-heading { padding: 0 1; text-style: bold; }
    TargetScreen #targets { border-subtitle-color: $text-muted; border-subtitle-style: italic; }
    """

    @dataclass
    class Chosen(Message):
        """The user wants the plan for this target."""

    @dataclass
    class ContextChosen(Message):
        """The user picked another kubeconfig context: the App makes a session for it."""

        name: str

    @dataclass
    class ContextsLoaded(Message):
        """The kubeconfig was read (``error`` is its one line when it could not be)."""

        contexts: list[KubeContext]
        current: str | None
        error: str | None = None

    @dataclass
    class ChecksFinished(Message):
        results: list[CheckResult]
        report: PreflightReport | None = None  # aws: the matrix the checks came from

    @dataclass
    class RegionsListed(Message):
        """aws: the regions the matrix is about to check."""

        regions: list[str]

    @dataclass
    class RegionChecked(Message):
        """aws: one region's checks returned."""

        report: RegionReport

    @dataclass
    class ZoneChosen(Message):
        """The user picked another feasible AZ: the App makes a session with that availability zone."""

        region: str
        zone: str

    @dataclass
    class QuotaIncreaseAsked(Message):
        """The user wants AWS asked for the quota the plan is short of: the App confirms first."""

        requests: list[tuple[str, QuotaStatus]]

    @dataclass
    class QuotaRequested(Message):
        filed: list[QuotaIncreaseRequest]

    BINDINGS = [
        # A priority binding: the focused list's own Enter would shadow it, and hide it from the footer.
        Binding("enter", "next", "Review plan", id="next", priority=True,
                tooltip="Compute the plan for this target (on another AZ or context: use that one first)"),
        Binding("r", "recheck", "Re-check", id="recheck", tooltip="Run the preflight checks again"),
        Binding("c", "pick_context", "Context", id="context",
                tooltip="Choose the kubeconfig context (Enter on another one re-checks against it)"),
        Binding("z", "pick_zone", "AZ", id="zone",
                tooltip="Choose the availability zone (Enter on another feasible one uses it)"),
        Binding("a", "all_regions", "All regions", id="all_regions",
                tooltip="Check every enabled region, not only the configured one (again: only that one)"),
        Binding("i", "request_quota", "Quota increase", id="quota_increase",
                tooltip="Ask AWS for the vCPU quota this plan is short of (asks to confirm first)"),
    ]

    checks: list[CheckResult] | None = None
    report: PreflightReport | None = None  # aws: the finished matrix
    kubeconfig_current: str | None = None  # the kubeconfig's current-context, once read
    all_regions = False

    @property
    def kube(self) -> bool:
        return self.session.config.target == "kube"

    @property
    def aws(self) -> bool:
        return self.session.config.target == "aws"

    def aws_layer(self) -> AwsLayer | None:
        if not self.aws:
            return None
        # lazy: boto3 and the aws layer only on the aws target
        from backend.layers.aws.layer import AwsLayer

        return next((layer for layer in self.session.stack.layers if isinstance(layer, AwsLayer)), None)

    def feasibility(self) -> FeasibilityPanel:
        """aws: the matrix (its module loads with the first aws screen, not before)."""
        # lazy: the AZ matrix widget only on the aws target
        from tui.matrix import FeasibilityPanel

        return self.query_one(FeasibilityPanel)

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="target-body"):
            yield Static("Where should this run go?", classes="heading")
            enabled = selectable_targets(self.session.config.target)
            target = self.session.config.target
            options = [Option(label, id=name, disabled=name not in enabled) for name, label in TARGETS]
            targets = OptionList(*options, id="targets")
            targets.border_subtitle = unselectable_reason(target)
            yield targets
            if self.aws:
                # lazy: the AZ matrix widget only on the aws target
                from tui.matrix import FeasibilityPanel

                cfg = self.session.config
                yield FeasibilityPanel(gpus=f"{cfg.gpu_node_count} × {cfg.gpu_node_type}", region=cfg.region,
                                       chosen=(cfg.region, cfg.availability_zone) if cfg.availability_zone else None)
            with Horizontal(id="target-details"):
                if self.kube:  # the picker beside the checks: at 80×24 both stay in view
                    with Vertical(id="target-left"):
                        yield Static("Kubeconfig context", id="contexts-heading")
                        yield OptionList(Option("reading the kubeconfig…", disabled=True), id="contexts")
                        yield self._config_box()
                else:
                    yield self._config_box()
                with VerticalScroll(id="checks-box", classes="panel"):
                    yield Static("checking…", id="checks")
        yield Footer()

    @staticmethod
    def _config_box() -> VerticalScroll:
        return VerticalScroll(Static(id="config-summary"), id="config-box", classes="panel")

    def on_mount(self) -> None:
        cfg = self.session.config
        rows = [("cluster", cfg.cluster_name), ("workers", str(cfg.effective_workers())),
                ("steps", str(cfg.steps)), ("seq len × batch", f"{cfg.seq_len} × {cfg.effective_batch_size()}"),
                ("precision", cfg.effective_precision()),
                ("model", cfg.effective_model_id()
                 or f"tiny Qwen2 ({cfg.local_layers} layers, hidden {cfg.local_hidden_size})")]
        if self.kube:
            rows += [("namespace", cfg.namespace), ("GPU nodes", f"{cfg.gpu_node_count} × {cfg.gpus_per_node} GPUs")]
        if self.aws:
            rows += [("region", cfg.region), ("GPU nodes", f"{cfg.gpu_node_count} × {cfg.gpu_node_type}"),
                     ("AZ", cfg.availability_zone or "the recommended one")]
        self.query_one("#config-summary", Static).update(render_config(rows))
        targets = self.query_one("#targets", OptionList)
        if self.kube or self.aws:  # two rows of air fewer, so the checks fit beside the picker at 80×24
            for widget in (self.query_one(".heading"), targets):
                widget.styles.margin = (0, 0, 0, 0)
        targets.highlighted = next(i for i, (name, _) in enumerate(TARGETS)
                                   if name in selectable_targets(cfg.target))
        if self.aws:
            self.feasibility().reset(all_regions=self.all_regions)
        # On kube the context is the one choice left to make here, on aws the AZ: its picker has the focus.
        (self.query_one("#contexts", OptionList) if self.kube else
         self.feasibility().matrix if self.aws else targets).focus()
        # After the first paint: the checks import the target's modules, which the first frame doesn't need.
        self.call_after_refresh(self.run_checks)
        if self.kube:
            self.call_after_refresh(self.load_contexts)

    # --- workers: they post messages, the handlers below change widgets ------------------
    @work(exclusive=True, group="checks")
    async def run_checks(self) -> None:
        layer = self.aws_layer()
        if layer is not None:
            # lazy: boto3 and the aws layer only on the aws target
            from backend.layers.aws.layer import MatrixWatch

            def listed(names: list[str]) -> None:
                self.post_message(self.RegionsListed(names))

            def checked(region: RegionReport) -> None:
                self.post_message(self.RegionChecked(region))

            layer.watch = MatrixWatch(on_listed=listed, on_region=checked, all_regions=self.all_regions)
        try:
            results = await self.session.preflight()
        except Exception as exc:  # noqa: BLE001 - shown to the user, not swallowed
            line = exc.message if isinstance(exc, RtuiError) else f"{type(exc).__name__}: {exc}"
            if layer is None:
                self.wizard.report_error(exc)
                check_id, title = "preflight", "Checks"
            else:  # the matrix says it (once: no notification too); Enter is refused with this line
                check_id, title = "aws.preflight", "AWS preflight"
            # The checks panel has the failure too (never "checking…" for ever).
            self.post_message(self.ChecksFinished([CheckResult(
                id=check_id, title=title, status=CheckStatus.FAIL, detail=line,
                remedy=exc.remedy if isinstance(exc, RtuiError) else None)]))
            return
        self.post_message(self.ChecksFinished(results, layer.report if layer is not None else None))

    @work(exclusive=True, group="quota")
    async def file_quota_increase(self, region: str) -> None:
        """After the App's confirmation: the same request `rtui check --request-quota-increase --yes` files."""
        # lazy: boto3 and the aws layer only on the aws target
        from backend.aws.quota_requests import request_missing_quota
        from backend.layers.aws_preflight import preflight_request

        request = preflight_request(self.session.ctx).model_copy(update={"regions": [region]})
        try:
            filed = await request_missing_quota(request)
        except Exception as exc:  # noqa: BLE001 - shown to the user, not swallowed
            self.wizard.report_error(exc)
            return
        self.post_message(self.QuotaRequested(filed))

    @work(exclusive=True, group="contexts")
    async def load_contexts(self) -> None:
        # lazy: the kubernetes client only on the kube target
        from backend.layers.kubernetes.access import kube_contexts

        try:
            contexts, current = await asyncio.to_thread(kube_contexts, self.session.config.kubeconfig)
        except RtuiError as exc:  # the preflight's Kubernetes API check shows it with its remedy
            self.post_message(self.ContextsLoaded([], None, exc.message))
            return
        except Exception as exc:  # noqa: BLE001 - shown to the user, not swallowed
            self.wizard.report_error(exc)
            return
        self.post_message(self.ContextsLoaded(contexts, current))

    def on_target_screen_checks_finished(self, message: ChecksFinished) -> None:
        self.checks = message.results
        self.report = message.report
        # The matrix shows the regions, and what stopped it from filling (with what to do): the panel
        # does not say it again.
        stopped = next((c for c in message.results if c.id in MATRIX_FAILURES and c.status is CheckStatus.FAIL),
                       None) if self.aws else None
        shown = [c for c in message.results if not c.id.startswith("aws.region.") and c is not stopped]
        self.query_one("#checks", Static).update(render_checks(shown))
        if self.aws:
            failed = None if stopped is None else stopped.detail + (f" — {stopped.remedy}" if stopped.remedy else "")
            self.feasibility().finished(message.report, failed)
        self.refresh_bindings()

    def on_target_screen_regions_listed(self, message: RegionsListed) -> None:
        self.feasibility().listed(message.regions)

    def on_target_screen_region_checked(self, message: RegionChecked) -> None:
        self.feasibility().checked(message.report)

    def on_target_screen_quota_requested(self, message: QuotaRequested) -> None:
        if not message.filed:
            self.notify("No quota is short for this plan: nothing was requested.")
        for r in message.filed:
            self.notify(f"requested {r.quota_code} = {r.desired_value:g} vCPUs in {r.region}: {r.status}"
                        + (f" (case {r.case_id})" if r.case_id else ""), title="Quota increase", timeout=10)

    def on_target_screen_contexts_loaded(self, message: ContextsLoaded) -> None:
        picker = self.query_one("#contexts", OptionList)
        picker.clear_options()
        if message.error is not None:
            picker.add_option(Option(Text(f"no contexts: {message.error}", style="red"), disabled=True))
            picker.disabled = True  # nothing to pick: Enter goes to the targets (and is refused there)
            self.query_one("#targets", OptionList).focus()
            return
        self.kubeconfig_current = message.current
        chosen = self.session.config.context or message.current
        picker.add_options([Option(render_context(c, current=c.name == message.current), id=c.name)
                            for c in message.contexts])
        names = [c.name for c in message.contexts]
        if chosen in names:
            picker.highlighted = names.index(chosen)

    # --- actions -------------------------------------------------------------------------
    def short_quotas(self) -> list[tuple[str, QuotaStatus]]:
        """The short quotas of the highlighted AZ's region (else the configured one), once the matrix is in."""
        if self.report is None:
            return []
        # lazy: boto3 and the aws layer only on the aws target
        from backend.aws.quota_requests import short_quotas

        region = self.feasibility().highlighted_region
        short = short_quotas(self.report.regions)
        return [s for s in short if s[0] == region] or [s for s in short if s[0] == self.session.config.region]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "next":  # offered only where Enter acts: no plan to review past a failed check
            return not any(c.status is CheckStatus.FAIL for c in self.checks or []) or self._enter_picks()
        if action == "pick_context":
            return self.kube
        if action in ("pick_zone", "all_regions"):
            return self.aws
        if action == "request_quota":
            return self.aws and not self.wizard.read_only and bool(self.short_quotas())
        return True

    def _enter_picks(self) -> bool:
        """Whether Enter would switch to another AZ or context (that it does even past a failed check)."""
        focused = self.focused
        if not isinstance(focused, OptionList) or focused.highlighted is None or focused.id not in ("matrix",
                                                                                                    "contexts"):
            return False
        option = focused.get_option_at_index(focused.highlighted)
        if option.disabled or option.id is None:
            return False
        if focused.id == "matrix":
            return not self.feasibility().is_in_use(option.id)
        return option.id != (self.session.config.context or self.kubeconfig_current)

    def action_recheck(self) -> None:
        self.query_one("#checks", Static).update("checking…")
        self.checks = None
        if self.aws:
            self.report = None
            self.feasibility().reset(all_regions=self.all_regions)
            self.refresh_bindings()
        self.run_checks()

    def action_all_regions(self) -> None:
        self.all_regions = not self.all_regions
        self.action_recheck()

    def action_pick_context(self) -> None:
        self.query_one("#contexts", OptionList).focus()

    def action_pick_zone(self) -> None:
        self.feasibility().matrix.focus()

    def action_request_quota(self) -> None:
        requests = self.short_quotas()
        if requests:
            self.post_message(self.QuotaIncreaseAsked(requests))

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_list.id in ("matrix", "contexts"):
            self.refresh_bindings()  # the quota on offer is the highlighted region's; Enter may pick it

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """A click on an option (Enter is the screen's own key, below)."""
        event.stop()
        self.choose(event.option_list.id, event.option.id)

    def action_next(self) -> None:
        focused = self.focused
        option = None
        if isinstance(focused, OptionList) and focused.highlighted is not None:
            option = focused.get_option_at_index(focused.highlighted)
        if option is not None and not option.disabled:
            self.choose(focused.id if isinstance(focused, OptionList) else None, option.id)
        else:
            self.go_on()

    def choose(self, list_id: str | None, option_id: str | None) -> None:
        """Enter on an option: another AZ or context is used first (a new session); the one in use goes on."""
        if list_id == "matrix" and option_id is not None and not self.feasibility().is_in_use(option_id):
            region, zone = option_id.split("/", 1)
            self.post_message(self.ZoneChosen(region, zone))
            return
        if list_id == "contexts" and option_id is not None:
            in_use = self.session.config.context or self.kubeconfig_current
            if option_id != in_use:
                self.post_message(self.ContextChosen(option_id))
                return
        self.go_on()

    def go_on(self) -> None:
        failed = [c for c in self.checks or [] if c.status is CheckStatus.FAIL]
        if failed:
            self.notify(f"{failed[0].title}: {failed[0].remedy or failed[0].detail}", severity="error")
            return
        self.post_message(self.Chosen())
