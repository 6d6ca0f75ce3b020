"""Training throughput: a stats line and a tokens/s (or loss) graph, both from one frozen snapshot.

``ThroughputSnapshot.build`` reads the bounded ``MetricSeries`` once per refresh; the widgets
render from the snapshot they hold and never look at the series themselves.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Label
from textual_plot import HiResMode, PlotWidget

from backend.telemetry import MetricSeries
from tui.render import eval_line, format_duration

ETA_WINDOW = 20  # recent steps whose mean step time predicts the rest
SPARK_POINTS = 240
# One NaN object for every gap: tuples compare items by identity first, so snapshots with gaps
# still compare equal (a fresh float("nan") never equals itself and would repaint every tick).
_GAP = float("nan")


@dataclass(frozen=True)
class ThroughputSnapshot:
    """The run's progress as the widgets show it; equal snapshots render alike."""

    steps: tuple[float, ...] = ()  # x of the graph: the step (or the point's index when steps are missing)
    tokens_per_s: tuple[float, ...] = ()  # NaN where a point had none (the plot drops it)
    losses: tuple[float, ...] = ()
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    tokens_per_s_now: float | None = None
    step_time_s: float | None = None
    mfu: float | None = None
    eta_s: float | None = None
    cost_per_hour: float | None = None
    cost_so_far: float | None = None
    cost_exact: bool = True  # False: an upper bound (the cost meter's "at most")
    summary_tokens_per_s: float | None = None
    summary_loss: float | None = None
    finished: bool = False
    eval_text: str | None = None  # "eval loss 6.93 → 0.08 on 2,048 held-out tokens" (tui.render.eval_line)
    model_uri: str | None = None  # where the job wrote the model (the summary's model.uri)

    @classmethod
    def build(cls, series: MetricSeries, *, total_steps: int | None, cost_per_hour: float | None = None,
              cost_so_far: float | None = None, cost_exact: bool = True) -> ThroughputSnapshot:
        """The cost is the run's cost meter's (``backend.session.cost_meter``), what the teardown modal and
        `rtui status` say too."""
        points = list(series.points)
        steps = tuple(float(p.step) if p.step is not None else float(i) for i, p in enumerate(points))
        tokens = tuple(p.tokens_per_s if p.tokens_per_s is not None else _GAP for p in points)
        losses = tuple(p.loss if p.loss is not None else _GAP for p in points)
        latest = points[-1] if points else None
        step = latest.step if latest else None
        recent = [p.step_time_s for p in points[-ETA_WINDOW:] if p.step_time_s]
        eta = None
        if step is not None and total_steps and recent and step < total_steps:
            # No step left is no estimate: "ETA 0s" stood on screen while the job evaluated and wrote
            # its model, and on a run that ended without its summary line.
            eta = (total_steps - step) * sum(recent) / len(recent)
        cost = cost_per_hour if cost_per_hour else None  # a free (local) run shows no cost at all
        summary = series.summary or {}
        return cls(
            steps=steps, tokens_per_s=tokens, losses=losses, step=step, total_steps=total_steps,
            loss=latest.loss if latest else None, tokens_per_s_now=latest.tokens_per_s if latest else None,
            step_time_s=latest.step_time_s if latest else None, mfu=latest.mfu if latest else None, eta_s=eta,
            cost_per_hour=cost, cost_so_far=cost_so_far if cost is not None else None, cost_exact=cost_exact,
            summary_tokens_per_s=_float(summary.get("tokens_per_s_mean")),
            summary_loss=_float(summary.get("final_loss")), finished=series.summary is not None,
            eval_text=eval_line(summary) if summary.get("eval_loss_before") is not None else None,
            model_uri=_model_uri(summary),
        )

    @property
    def spark(self) -> list[float]:
        """Recent tokens/s for a sparkline (gaps left out)."""
        return [v for v in self.tokens_per_s[-SPARK_POINTS:] if v == v]


def downsample(xs: tuple[float, ...], ys: tuple[float, ...], buckets: int) -> tuple[list[float], list[float]]:
    """At most ``buckets`` points, each the mean of a run of neighbours (gaps skipped).

    The plot draws every point it is given in Python: 4096 of them cost ~200 ms a frame,
    while the canvas has only ~2 dots per column to show them with.
    """
    if len(xs) <= buckets:
        return list(xs), list(ys)
    out_x: list[float] = []
    out_y: list[float] = []
    for b in range(buckets):
        lo, hi = len(xs) * b // buckets, len(xs) * (b + 1) // buckets
        values = [y for y in ys[lo:hi] if y == y]
        if values:
            out_x.append(sum(xs[lo:hi]) / (hi - lo))
            out_y.append(sum(values) / len(values))
    return out_x, out_y


def _model_uri(summary: dict[str, object]) -> str | None:
    model = summary.get("model")
    uri = model.get("uri") if isinstance(model, dict) else None
    return uri if isinstance(uri, str) else None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class RunStats(Widget):
    """One line (two when finished): step/total, loss, tokens/s, step time, MFU, ETA, cost."""

    DEFAULT_CSS = "RunStats { height: auto; }"

    snapshot: reactive[ThroughputSnapshot] = reactive(ThroughputSnapshot)

    def watch_snapshot(self) -> None:
        # A layout (of the whole screen) only when the stats change height: they change every tick.
        if self.is_mounted and self.get_content_height(self.size, self.size, self.content_size.width) \
                != self.content_size.height:
            self.refresh(layout=True)

    def render(self) -> Text:
        return self._lines(self.content_size.width)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines(width).plain.splitlines()) or 1

    def _items(self) -> list[tuple[str, str]]:
        s = self.snapshot
        if s.step is None:
            items = [("waiting for the first step…", "dim")]
        else:
            items = [(f"step {s.step}/{s.total_steps or '?'}", "bold")]
            if s.loss is not None:
                items.append((f"loss {s.loss:.4f}", ""))
            if s.tokens_per_s_now is not None:
                items.append((f"{s.tokens_per_s_now:,.0f} tok/s", "bold cyan"))
            if s.step_time_s is not None:
                items.append((f"{s.step_time_s * 1000:,.0f} ms/step", ""))
            if s.mfu is not None:
                items.append((f"MFU {s.mfu:.1%}", ""))
            if s.eta_s is not None and not s.finished:
                items.append((f"ETA {format_duration(s.eta_s)}", ""))
        if s.cost_so_far is not None and s.cost_per_hour is not None:
            bound = "" if s.cost_exact else "at most "
            items.append((f"{bound}${s.cost_so_far:,.2f} so far (${s.cost_per_hour:,.2f}/h)", "yellow"))
        return items

    def _lines(self, width: int) -> Text:
        """The items packed into lines of ``width``: a narrow screen breaks between items, never inside one."""
        text = Text()
        used = 0
        for item, style in self._items():
            if used and width and used + 2 + len(item) > width:
                text.append("\n")
                used = 0
            elif used:
                text.append("  ")
                used += 2
            text.append(item, style=style)
            used += len(item)
        s = self.snapshot
        if s.finished:
            mean = f"{s.summary_tokens_per_s:,.0f}" if s.summary_tokens_per_s is not None else "?"
            loss = f"{s.summary_loss:.4f}" if s.summary_loss is not None else "?"
            lines = [(f"finished: mean {mean} tokens/s, final loss {loss}", "green")]
            if s.eval_text:
                lines.append((s.eval_text, "green"))
            if s.model_uri:
                model, hint = f"model: {s.model_uri}", "(M copies it here)"
                whole = f"{model}  {hint}"
                lines += [(whole, "bold")] if not width or len(whole) <= width else [(model, "bold"), (hint, "bold")]
            for line, style in lines:
                for piece in _fold(line, width):
                    text.append(f"\n{piece}", style=style)
        return text


def _fold(line: str, width: int) -> list[str]:
    """``line`` in lines of at most ``width`` (0: any), broken between words; a longer word, such as a
    path, is broken in pieces, never cut."""
    return textwrap.wrap(line, width, break_on_hyphens=False) if width and len(line) > width else [line]


class ThroughputGraph(Widget):
    """tokens/s against the step with axes; `l` on the run screen switches to the loss."""

    DEFAULT_CSS = """
    ThroughputGraph { height: 1fr; }
    ThroughputGraph > #graph-title { width: 1fr; padding: 0 1; color: $text-muted; }
    ThroughputGraph > PlotWidget { height: 1fr; }
    """

    snapshot: reactive[ThroughputSnapshot] = reactive(ThroughputSnapshot)
    show_loss: reactive[bool] = reactive(False)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._drawn: tuple[object, ...] | None = None  # what the plot holds now

    def compose(self) -> ComposeResult:
        yield Label("", id="graph-title")
        plot = PlotWidget(allow_pan_and_zoom=False)
        plot.can_focus = False  # its zoom/pan keys would crowd the footer and steal the log's focus
        # Tighter margins than the defaults (2, 3, 10): the graph shares a small screen.
        for margin, value in ((PlotWidget.margin_top, 1), (PlotWidget.margin_bottom, 2), (PlotWidget.margin_left, 9)):
            plot.set_reactive(margin, value)
        yield plot

    def on_mount(self) -> None:
        self._draw()

    def watch_snapshot(self) -> None:
        self._draw()

    def watch_show_loss(self) -> None:
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    @property
    def title(self) -> str:
        what = "loss" if self.show_loss else "tokens/s"
        other = "tokens/s" if self.show_loss else "loss"
        return f"{what} by step   (l: {other})"

    def _draw(self) -> None:
        if not self.is_mounted:
            return
        s = self.snapshot
        # A priced run's snapshot changes every tick (its cost); the curve only with new points.
        key = (s.steps, s.losses if self.show_loss else s.tokens_per_s, self.show_loss, self.size.width)
        if key == self._drawn:
            return
        self._drawn = key
        self.query_one("#graph-title", Label).update(self.title, layout=False)  # one line, same width
        plot = self.query_one(PlotWidget)
        plot.clear()
        x, y = downsample(s.steps, s.losses if self.show_loss else s.tokens_per_s, max(16, 2 * self.size.width))
        if x:
            plot.plot(x, y, line_style="bright_magenta" if self.show_loss else "bright_cyan",
                      hires_mode=HiResMode.BRAILLE)
        plot.set_xlabel("step")
