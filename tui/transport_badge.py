"""The NCCL transport badge: what the job's collectives run over, at a glance, and why.

Driven by one frozen ``TransportSnapshot`` built from the telemetry verdict; ``render`` reads
that snapshot (and whether the detail is open) and nothing else. The words alone carry the
verdict (``EFA``, ``TCP FALLBACK (Socket)``…) so NO_COLOR terminals lose nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.events import Click
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget

from backend.textutil import display_lines
from training.logparse.verdict import Verdict, provider_transport

# transport -> (badge words, style); styles differ between every pair a person must tell apart.
_BADGES: dict[str, tuple[str, str]] = {
    "efa": ("EFA", "bold white on dark_green"),
    "efa_gdr": ("EFA+GDR", "bold black on bright_green"),
    "socket": ("TCP FALLBACK (Socket)", "bold white on red"),
    "ib": ("IB / RoCE", "bold black on cyan"),
    "intra_node": ("INTRA-NODE (no network used)", "bold black on bright_blue"),
    "gloo": ("GLOO (CPU)", "bold black on bright_white"),
    "unknown": ("UNKNOWN", "dim"),
}
# Before the first line: NCCL or gloo, the job has not said yet.
_WAITING = ("transport: waiting for the job's first lines", "dim")
# The OFI plugin on a libfabric provider that is not EFA (Slingshot's cxi, tcp, verbs): none of the
# transports above, so the badge names the provider (shared/nccl_logs' label rules, issue 39).
_OTHER_FABRIC_STYLE = "bold black on yellow"


@dataclass(frozen=True)
class TransportSnapshot:
    """What the badge shows: a verdict reduced to plain, comparable fields."""

    transport: str = "unknown"
    basis: str | None = None
    reason: str = "no NCCL output seen"
    evidence: str | None = None  # the first line the verdict rests on
    warnings: tuple[str, ...] = ()
    nodes: int | None = None
    ranks: int | None = None
    provider: str | None = None  # the libfabric provider the OFI plugin selected, when a line names it

    @classmethod
    def from_verdict(cls, verdict: Verdict) -> TransportSnapshot:
        lines = verdict.decided_by or verdict.evidence
        evidence = display_lines([lines[0]])[0] if lines else None  # a log line: no escapes reach the screen
        return cls(transport=verdict.transport, basis=verdict.basis, reason=verdict.reason,
                   evidence=evidence, warnings=verdict.warnings, nodes=verdict.nodes, ranks=verdict.ranks,
                   provider=verdict.provider)

    @property
    def waiting(self) -> bool:
        return self.transport == "unknown" and self.evidence is None

    @property
    def other_fabric(self) -> bool:
        """Unknown because the OFI plugin runs on a libfabric provider that is not EFA."""
        return self.transport == "unknown" and bool(self.provider) and provider_transport(self.provider) != "efa"

    @property
    def words(self) -> str:
        """The verdict in words, with no help from colour."""
        return self.look()[0]

    def look(self) -> tuple[str, str]:
        """(badge words, style)."""
        if self.waiting:
            return _WAITING
        if self.other_fabric:
            return f"NOT EFA (libfabric {self.provider})", _OTHER_FABRIC_STYLE
        return _BADGES.get(self.transport, _BADGES["unknown"])


ENTRY_INDENT, HANG_INDENT = "  ", "    "


class TransportBadge(Widget):
    """One line: the badge, its basis and size; click it (or `t` on the run screen) for the why."""

    DEFAULT_CSS = """
    TransportBadge { height: auto; width: 1fr; text-wrap: nowrap; text-overflow: ellipsis; }
    TransportBadge.-expanded { text-wrap: wrap; }
    """

    snapshot: reactive[TransportSnapshot] = reactive(TransportSnapshot, layout=True)
    expanded: reactive[bool] = reactive(False, layout=True)
    """Show the reason, the evidence line and the warnings under the badge."""

    def __init__(self, snapshot: TransportSnapshot | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        if snapshot is not None:
            self.set_reactive(TransportBadge.snapshot, snapshot)

    def render(self) -> Text:
        return self._text(self.size.width)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._text(width).split())

    def _text(self, width: int) -> Text:
        """The badge line; expanded, the why lines under it, each wrapped with its continuation
        hanging under its text (``ENTRY_INDENT``, then ``HANG_INDENT``)."""
        snap = self.snapshot
        words, style = snap.look()
        text = Text()
        text.append(f" {words} ", style=style)
        if snap.basis:
            text.append(f" {snap.basis}", style="bold")
        if snap.warnings and not self.expanded:  # before the size: a narrow screen cuts from the right
            text.append(f" · {len(snap.warnings)} warning{'s' if len(snap.warnings) > 1 else ''}", style="yellow")
        size = [f"{snap.nodes} node{'s' if snap.nodes != 1 else ''}" if snap.nodes is not None else "",
                f"{snap.ranks} rank{'s' if snap.ranks != 1 else ''}" if snap.ranks is not None else ""]
        if any(size):
            text.append(" · " + ", ".join(s for s in size if s), style="dim")
        if not snap.waiting:
            text.append("  ▾ why" if self.expanded else "  ▸ why (t)", style="dim")
        if not self.expanded:
            return text
        entries = [Text.assemble("why: ", snap.reason)]
        if snap.evidence:
            entries.append(Text.assemble(("evidence: ", "dim"), (snap.evidence, "italic")))
        entries += [Text(f"warning: {warning}", style="yellow") for warning in snap.warnings]
        console = self.app.console
        out = Text("\n").join(text.wrap(console, width)) if width > 0 else text
        for entry in entries:
            lines = entry.wrap(console, max(width - len(HANG_INDENT), 10))
            for i, line in enumerate(lines):
                out.append("\n")
                out.append(ENTRY_INDENT if i == 0 else HANG_INDENT)
                out.append_text(line)
        return out

    def watch_expanded(self, expanded: bool) -> None:
        self.set_class(expanded, "-expanded")
        if self.parent is not None:  # the row it sits in gives it the whole width (rtui.tcss: -why)
            self.parent.set_class(expanded, "-why")

    def toggle(self) -> None:
        self.expanded = not self.expanded

    def on_click(self, event: Click) -> None:
        event.stop()
        self.toggle()
