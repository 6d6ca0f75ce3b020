"""The AWS feasibility matrix on the target screen: one row per AZ, grouped by region.

Driven by one frozen ``MatrixSnapshot`` (regions fill in as their checks return); each AZ is an
option whose id is ``region/zone``, so choosing one is an ``OptionList.OptionSelected``. Blocked
AZs are disabled and say why on the line below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from targets.aws.cloud.report import PreflightReport, RegionReport, ZoneReport
from targets.aws.cloud.verdict import zone_price

_VERDICT = {"feasible": ("✓", "green"), "warning": ("!", "yellow"), "blocked": ("✗", "red")}
# mark, flag, zone, zone id, GPU offered, EFA, quota headroom, reservation, EKS zone, $/h
_COLUMNS = ((2, "<"), (2, "<"), (16, "<"), (10, "<"), (4, "<"), (4, "<"), (8, ">"), (10, "<"), (4, "<"), (9, ">"))
HEADER = ("", "", "AZ", "zone id", "GPU", "EFA", "quota", " reserved", "EKS", "$/h")
# A Spot plan's rows (67 cells: 80 columns leave the list 70): the AZ's Spot placement score and the expected
# $/h of training (verdict.expected_cost) after the plan's $/h at Spot; no reservation (Spot draws on none) and
# no quota cell (the region's, on its line above, with what it is short by).
_SPOT_COLUMNS = ((2, "<"), (2, "<"), (16, "<"), (10, "<"), (4, "<"), (4, "<"), (6, ">"), (5, "<"), (9, ">"),
                 (9, ">"))
SPOT_HEADER = ("", "", "AZ", "zone id", "GPU", "EFA", "score", " EKS", "$/h", "exp $/h")


def zone_id(region: str, zone: str) -> str:
    return f"{region}/{zone}"


@dataclass(frozen=True)
class MatrixSnapshot:
    """What the matrix shows: every region listed so far (None while its checks run)."""

    regions: tuple[tuple[str, RegionReport | None], ...] = ()
    recommended: tuple[str, str] | None = None  # (region, zone)
    chosen: tuple[str, str] | None = None  # the run's availability zone, when set
    failed: str | None = None  # the whole check stopped: its one line
    finished: bool = False

    def with_region(self, report: RegionReport) -> MatrixSnapshot:
        regions = dict(self.regions)
        regions[report.region] = report
        return MatrixSnapshot(tuple(regions.items()), self.recommended, self.chosen, self.failed, self.finished)

    def region(self, name: str) -> RegionReport | None:
        return dict(self.regions).get(name)

    @property
    def in_use(self) -> tuple[str, str] | None:
        """The AZ the plan would use now: the chosen one, else the recommendation."""
        return self.chosen or self.recommended


@dataclass
class _Cells:
    values: list[Text] = field(default_factory=list)
    columns: tuple[tuple[int, str], ...] = _COLUMNS

    def add(self, value: str, style: str = "") -> None:
        self.values.append(Text(value, style=style))

    def line(self) -> Text:
        out = Text()
        for (width, align), cell in zip(self.columns, self.values, strict=True):
            cell.truncate(width - 1 if width > 2 else width, overflow="ellipsis")
            pad = " " * (width - cell.cell_len)
            out.append_text(Text(pad) + cell if align == ">" else cell + Text(pad))
        return out


def header_line(*, spot: bool = False) -> Text:
    cells = _Cells(columns=_SPOT_COLUMNS if spot else _COLUMNS)
    for name in SPOT_HEADER if spot else HEADER:
        cells.add(name, "bold")
    return cells.line()


def spot_region(region: RegionReport) -> bool:
    """Whether the region was checked for a Spot plan (what only a Spot plan's scan fills in)."""
    return region.spot_interruptions is not None or any(
        z.price_per_hour is not None or z.spot_price is not None or z.spot_score is not None
        or z.expected_per_hour is not None for z in region.zones)


def score_cell(zone: ZoneReport) -> tuple[str, str]:
    """EC2's Spot placement score, 1-10 (how likely Spot capacity for the plan is there now)."""
    if zone.spot_score is None:
        return "?", "yellow"
    style = "green" if zone.spot_score >= 7 else "yellow" if zone.spot_score >= 4 else "red"
    return f"{zone.spot_score}/10", style


def expected_cell(region: RegionReport, zone: ZoneReport) -> tuple[str, str]:
    """A Spot plan's expected $/h of training in the AZ ("~" for the built-in estimate, as $/h)."""
    value = zone.expected_per_hour
    if value is None:
        return "?", "yellow"
    if value == float("inf"):
        return "never", "red"
    return (f"~${value:.2f}", "yellow") if estimated(region) else (f"${value:.2f}", "")


def _yes(flag: bool) -> tuple[str, str]:
    return ("✓", "green") if flag else ("✗", "red")


def quota_cell(region: RegionReport) -> tuple[str, str]:
    quota = region.quota
    if quota is None or quota.headroom is None:
        return "?", "yellow"
    room = quota.headroom - quota.needed
    return (f"+{room:.0f}", "green") if room >= 0 else (f"{room:.0f}", "red")


def reservation_cell(zone: ZoneReport) -> tuple[str, str]:
    usable = [r for r in zone.reservations if r.usable]
    if not usable:
        return (" —", "dim") if not zone.reservations else (" unusable", "yellow")
    kind = "block" if any(r.kind == "capacity-block" for r in usable) else "odcr"
    return f" {kind} {sum(r.available for r in usable)}", "green"


def estimated(region: RegionReport) -> bool:
    return bool(region.price_source) and "estimate" in (region.price_source or "")


def price_cell(region: RegionReport, zone: ZoneReport) -> tuple[str, str]:
    """The plan's $/h in the AZ (a Spot plan's differs by AZ, else the region's); "~" marks the built-in
    estimate (the panel's legend says whose prices)."""
    price = zone_price(region, zone)
    if price is None:
        return "?", "yellow"
    if estimated(region):
        return f"~${price:.2f}", "yellow"
    return f"${price:.2f}", ""


def zone_prompt(region: RegionReport, zone: ZoneReport, *, recommended: bool, chosen: bool) -> Text:
    spot = spot_region(region)
    cells = _Cells(columns=_SPOT_COLUMNS if spot else _COLUMNS)
    mark, style = _VERDICT[zone.verdict]
    cells.add(mark, style)
    cells.add("●" if chosen else "★" if recommended else "", "bold cyan" if chosen else "bold yellow")
    cells.add(zone.zone, "bold" if zone.feasible else "dim")
    cells.add(zone.zone_id, "dim")
    cells.add(*_yes(zone.gpu_offered))
    cells.add(*_yes(zone.efa))
    if spot:
        cells.add(*score_cell(zone))
        mark, style = _yes(zone.eks_supported)
        cells.add(f" {mark}", style)
    else:
        cells.add(*quota_cell(region))
        cells.add(*reservation_cell(zone))
        cells.add(*_yes(zone.eks_supported))
    cells.add(*price_cell(region, zone))
    if spot:
        cells.add(*expected_cell(region, zone))
    text = cells.line()
    notes = [(r, "red") for r in zone.reasons] if not zone.feasible else [(w, "yellow") for w in zone.warnings]
    for note, note_style in notes:
        text.append(f"\n    ↳ {note}", style=f"italic {note_style}")
    return text


def region_prompt(name: str, region: RegionReport | None) -> Text:
    text = Text(name, style="bold")
    if region is None:
        text.append("  checking…", style="dim italic")
        return text
    quota = region.quota
    if quota is not None and quota.code:
        limit = f"{quota.limit:.0f}" if quota.limit is not None else "?"
        text.append(f"  quota {quota.code}: {quota.used if quota.used is not None else '?'}/{limit} used, "
                    f"needs {quota.needed}", style="dim")
        if quota.ok is False:
            text.append(f"  short by {quota.shortfall}", style="bold red")
    if region.spot_interruptions is not None:
        rate = region.spot_interruptions
        text.append(f"  Spot lost {'≥' if rate.at_least else ''}{rate.label}/mo", style="dim")
    if not region.zones:
        for reason in region.reasons or [region.error or "no AZs"]:
            text.append(f"\n    ↳ {reason}", style="italic red")
    return text


class AzMatrix(OptionList):
    """The feasibility matrix; the highlighted AZ is the one in use until the user moves."""

    snapshot: reactive[MatrixSnapshot] = reactive(MatrixSnapshot, always_update=True)

    def watch_snapshot(self, snapshot: MatrixSnapshot) -> None:
        keep = self.highlighted_option.id if self.highlighted_option is not None else None
        self.clear_options()
        options: list[Option] = []
        for name, region in snapshot.regions:
            options.append(Option(region_prompt(name, region), disabled=True))
            if region is None:
                continue
            for zone in region.zones:
                where = (name, zone.zone)
                prompt = zone_prompt(region, zone, recommended=where == snapshot.recommended,
                                     chosen=where == snapshot.chosen)
                options.append(Option(prompt, id=zone_id(*where), disabled=not zone.feasible))
        if snapshot.failed is not None:
            options.append(Option(Text(f"✗ {snapshot.failed}", style="red"), disabled=True))
        self.add_options(options)
        ids = [o.id for o in options]
        # The AZ in use wins once known (the recommendation comes with the last region); till then, where the user is.
        for target in (zone_id(*snapshot.in_use) if snapshot.in_use else None, keep):
            if target is not None and target in ids:
                self.highlighted = ids.index(target)
                break


class FeasibilityPanel(Vertical):
    """The aws target's matrix with its column heading, fed as the preflight returns region by region.

    The target screen builds it only for aws, so the local and kube first frames never import the
    aws report models."""

    DEFAULT_CSS = """
    FeasibilityPanel { height: auto; border: round $primary 40%; padding: 0 1; }
    FeasibilityPanel:focus-within { border: round $primary; }
    FeasibilityPanel #matrix-heading { height: 1; }
    FeasibilityPanel #matrix { height: auto; max-height: 12; border: none; padding: 0; }
    """

    def __init__(self, *, gpus: str, region: str, chosen: tuple[str, str] | None) -> None:
        super().__init__(id="feasibility")
        self.gpus = gpus  # "2 × g6.12xlarge"
        self.region_name = region
        self.chosen = chosen  # the configured AZ, when there is one

    def compose(self) -> ComposeResult:
        yield Static(header_line(), id="matrix-heading")
        yield AzMatrix(id="matrix")

    def _heading(self) -> None:
        """A Spot plan's columns once its first region says it is one."""
        regions = [r for _, r in self.matrix.snapshot.regions if r is not None]
        self.query_one("#matrix-heading", Static).update(header_line(spot=any(spot_region(r) for r in regions)))

    @property
    def matrix(self) -> AzMatrix:
        return self.query_one(AzMatrix)

    def reset(self, *, all_regions: bool) -> None:
        """Checking (again): empty, titled with what is checked where."""
        where = "every enabled region" if all_regions else self.region_name
        # On the panel's border, with the column heading inside it above the rows.
        self.border_title = f"Feasibility · {self.gpus} · {where}"
        self.matrix.snapshot = MatrixSnapshot(chosen=self.chosen)
        self._legend()
        self._heading()

    def _legend(self) -> None:
        """The marks' meanings; "~" only once a row shows an estimate (the Pricing API did not answer)."""
        regions = [r for _, r in self.matrix.snapshot.regions if r is not None]
        label = next((r.price_source for r in regions if estimated(r)), None)
        self.border_subtitle = "★ recommended  ● chosen  ⏎ picks an AZ" + (f"  ~ {label}" if label else "")

    def listed(self, regions: list[str]) -> None:
        self.matrix.snapshot = MatrixSnapshot(tuple((name, None) for name in regions), chosen=self.chosen)

    def checked(self, report: RegionReport) -> None:
        self.matrix.snapshot = self.matrix.snapshot.with_region(report)
        self._legend()
        self._heading()

    def finished(self, report: PreflightReport | None, failed: str | None) -> None:
        rec = report.recommendation if report is not None else None
        self.matrix.snapshot = MatrixSnapshot(
            tuple((r.region, r) for r in report.regions) if report is not None else self.matrix.snapshot.regions,
            (rec.region, rec.zone) if rec is not None else None, self.chosen, failed, finished=True)
        self._legend()
        self._heading()

    @property
    def highlighted_region(self) -> str | None:
        option = self.matrix.highlighted_option
        return option.id.split("/")[0] if option is not None and option.id else None

    def is_in_use(self, option_id: str) -> bool:
        region, zone = option_id.split("/", 1)
        return (region, zone) == self.matrix.snapshot.in_use
