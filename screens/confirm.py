"""Confirmations: apply what costs money (a second key), tear down (type the cluster name), quit mid-step."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from backend.config import held_reason
from backend.errors import RtuiError
from backend.resources import Plan
from backend.store import RunStore
from tui.plan_diff import money
from tui.widgets import RtuiFooter


def apply_summary(plan: Plan) -> str:
    """``Apply: creates 29 resources, updates 1, $9.55/hour while up``: what a yes does, and what it costs."""
    counts = plan.counts()
    done = [(verb, counts[action]) for action, verb in
            (("create", "creates"), ("update", "updates"), ("replace", "replaces"), ("delete", "deletes"))
            if counts[action]]
    parts = [f"{verb} {n}" + ((" resource" if n == 1 else " resources") if i == 0 else "")
             for i, (verb, n) in enumerate(done)]
    what = ", ".join(parts) if parts else "changes nothing"
    cost = f"{money(plan.cost_per_hour)}/hour while up" if plan.cost_per_hour else "nothing priced"
    return f"Apply: {what}, {cost}"


class ConfirmApply(ModalScreen[bool]):
    """Applying a plan that costs money by the hour, or changes objects everyone on the cluster shares:
    what it costs and what it changes for others, then a second explicit key."""

    BINDINGS = [
        Binding("y", "answer(True)", "Apply", id="confirm-apply",
                tooltip="Apply the plan now; what is priced costs money until `rtui down`"),
        Binding("n,escape", "answer(False)", "Cancel", id="cancel-apply", tooltip="Back to the plan; nothing changes"),
    ]

    def __init__(self, plan: Plan) -> None:
        super().__init__()
        self.plan = plan

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Label(apply_summary(self.plan), id="apply-summary", classes="heading")
            shared = self.plan.cluster_wide()
            if shared:
                yield Label("It changes what everyone on the cluster shares:", id="apply-shared")
                for change in shared:
                    yield Label(f"{change.symbol} {change.address}: {change.cluster_wide}", classes="detail",
                                markup=False)
            if self.plan.cost_per_hour:
                yield Label("They keep costing money until you tear them down (`D`, or `rtui down`).")
            yield Label("Apply now? [b]y[/b] applies · [b]n[/b] / escape goes back to the plan")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class ConfirmConfigFile(ModalScreen[bool]):
    """A checkout's config file sets held fields (backend.trust) in a content the user has not confirmed yet."""

    # A file may hold a dozen of them: the list scrolls so the question stays on an 80x24 terminal.
    DEFAULT_CSS = """
    ConfirmConfigFile #confirm-fields { height: auto; max-height: 12; }
    ConfirmConfigFile .reason { color: $text-muted; }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Use them", id="confirm-config",
                tooltip="Take these values from the file; asked again whenever the file changes"),
        Binding("n,escape", "answer(False)", "Quit", id="refuse-config",
                tooltip="Quit without running anything; pass the values you want as flags instead"),
    ]

    def __init__(self, path: str, values: dict[str, Any]) -> None:
        super().__init__()
        self.path = path
        self.values = values

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Label(f"{self.path} sets what only you should decide:", classes="heading", markup=False)
            with VerticalScroll(id="confirm-fields"):
                for field, value in self.values.items():
                    yield Label(f"  {field} = {json.dumps(value)}", classes="detail", markup=False)
                    yield Label(f"    {held_reason(field)}", classes="reason", markup=False)
            yield Label("Use these values? [b]y[/b] uses them (until the file changes) · [b]n[/b] / escape quits",
                        id="confirm-question")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class ConfirmTeardown(ModalScreen[bool]):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="cancel", tooltip="Keep everything running")]

    DELETE_DATA = "delete data"

    MEASURING = "Kept unless you say so: the run's data (measuring…)"

    def __init__(self, cluster_name: str, what: str, details: list[str] | None = None,
                 data_line: Callable[[], Awaitable[str | None]] | None = None, *, keeps_data: bool = True) -> None:
        """``data_line`` says what data is kept (None: nothing); it may take seconds (a pod reads a kube
        volume, S3 lists a prefix), so it runs in a worker while the modal shows "measuring…".
        ``keeps_data``: the run has a place for checkpoints and models (a kube run without storage has
        none): only then is deleting them offered."""
        super().__init__()
        self.cluster_name = cluster_name
        self.what = what
        self.details = details or []
        self.keeps_data = keeps_data
        self.data_line = data_line
        self.data_text: str | None = self.MEASURING if data_line is not None else None
        self.delete_data = False  # typed "<cluster name> delete data": the run's checkpoints and model go too

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Label(f"Tear down {self.what}?", classes="heading")
            for line in self.details:
                yield Label(line, classes="detail", markup=False)
            if self.data_line is not None:
                yield Label(self.MEASURING, id="confirm-data", classes="detail", markup=False)
            yield Label(f"Type the cluster name [b]{self.cluster_name}[/b] and press enter. Escape cancels.")
            if self.keeps_data:
                yield Label(f"Checkpoints and models are kept; to delete them too, type "
                            f"[b]{self.cluster_name} {self.DELETE_DATA}[/b] instead.", classes="detail")
            yield Input(placeholder=self.cluster_name, id="confirm-input")
            yield Label("", id="confirm-error")

    def on_mount(self) -> None:
        if self.data_line is not None:
            self._measure(self.data_line)

    @work(exclusive=True, group="measure-data", exit_on_error=False)
    async def _measure(self, data_line: Callable[[], Awaitable[str | None]]) -> None:
        try:
            line = await data_line()
        except RtuiError as exc:  # the modal still tears down and says what it could not see; a bug goes up
            line = f"Kept unless you say so: the run's data (not measured: {str(exc).splitlines()[0][:120]})"
        self._show_data(line)

    def _show_data(self, line: str | None) -> None:
        self.data_text = line
        label = self.query("#confirm-data")
        if line is None:
            label.remove()
        else:
            label.first(Label).update(line)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        typed = " ".join(event.value.split())
        with_data = f"{self.cluster_name} {self.DELETE_DATA}"
        if typed == with_data and not self.keeps_data:
            self.query_one("#confirm-error", Label).update(
                "This run keeps no checkpoints or models: type the cluster name alone.")
        elif typed in (self.cluster_name, with_data):
            self.delete_data = typed != self.cluster_name
            self.dismiss(True)
        else:
            self.query_one("#confirm-error", Label).update("That is not the cluster name.")

    def action_cancel(self) -> None:
        self.dismiss(False)


class ConfirmDetach(ModalScreen[bool]):
    """Quitting while steps run: say what keeps running, and how to come back."""

    BINDINGS = [
        Binding("y", "answer(True)", "Detach", id="yes", tooltip="Quit now; what runs keeps running"),
        Binding("n,escape", "answer(False)", "Stay", id="no", tooltip="Cancel quitting and keep watching"),
    ]

    def __init__(self, run_id: str, *, job: bool = False, command: str = "rtui") -> None:
        super().__init__()
        self.run_id = run_id
        self.job = job  # a job runs (it goes on without us), rather than steps (they stop)
        self.command = command

    def compose(self) -> ComposeResult:
        resume = f"{self.command} --resume {self.run_id}"
        with Vertical(id="confirm"):
            if self.job:
                yield Label("The job is still running.", classes="heading")
                yield Label("Detaching leaves it running on the cluster (and the cluster up); nothing is torn "
                            "down. Come back with:", markup=False)
            else:
                yield Label("Steps are still running.", classes="heading")
                yield Label("Quitting stops the steps in flight; whatever has started keeps running and nothing "
                            "is torn down. Come back with:", markup=False)
            # On a line of its own, so it is never split where the box wraps.
            yield Label(resume, id="resume-command", markup=False)
            yield Label("Detach and quit? [b]y[/b] / [b]n[/b]")
        yield RtuiFooter()

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class PickRun(ModalScreen[str | None]):
    """`rtui --resume` with several live runs: which one to reattach to."""

    BINDINGS = [Binding("escape", "cancel", "Newest", id="cancel", tooltip="Resume the newest run")]

    def __init__(self, run_ids: list[str], store: RunStore) -> None:
        super().__init__()
        self.run_ids = run_ids
        self.store = store

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Label("Several runs are live. Resume which?", classes="heading")
            options = []
            for run_id in self.run_ids:
                record = self.store.load(run_id)
                options.append(Option(f"{run_id}  {record.target:<5} {record.cluster_name}  {record.status.value}",
                                      id=run_id))
            yield OptionList(*options, id="runs")

    def on_option_list_option_selected(self, event: Any) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
