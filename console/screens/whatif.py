"""`w` on the review screen: what if the window shown had run under other thresholds?

The window is the review's current range (or its ``since=``/``until=`` filter: the incident's
minutes). The form lists the thresholds the live retune edits (``t``), each as a ``--set``
line ``KEY=VALUE`` holding the value recorded as in force; the operator edits any of them
(or adds other ``--set`` keys) and presses ctrl+r (or Replay). The replay
(:mod:`gate.tools.replay`: load the window, fit the backend model, replay it at the
recorded thresholds and under the proposal) runs in a thread worker, so the screen keeps
rendering; a newer run cancels the view of an older one. The answer is the same table as
``tokengate replay``: recorded | replayed | error | proposal per class, a figure the
calibration does not trust (error over 25%) ending in '?' and dimmed in every column.

Read-only: nothing is applied to a gate from here (the review has no link).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Static, TextArea
from textual.worker import Worker, WorkerState

from gate.tools.replay import ReplayError, Window, load_window, proposal_from_set, run_replay, settable, table_cells


def proposal_text(lines: str, recorded: dict[str, str]) -> str:
    """The ``--set`` text of the form: its ``KEY=VALUE`` lines (blank and ``#`` lines skipped)
    whose value differs from the recorded one, comma-joined; "" when nothing changed."""
    changed = []
    for raw in lines.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{line!r}: give KEY=VALUE, e.g. budget.min_tokens=1024")
        if recorded.get(key.strip()) != value.strip():
            changed.append(f"{key.strip()}={value.strip()}")
    return ",".join(changed)


class WhatIfScreen(ModalScreen[None]):
    """See the module docstring. ``since``/``until``: the window (epoch seconds; None = the
    journal's first/last decision)."""

    DEFAULT_CSS = """
    WhatIfScreen #whatif-dialog {
        width: 96%;
        height: 94%;
    }
    WhatIfScreen #whatif-form {
        height: 12;
    }
    WhatIfScreen #whatif-table {
        height: 1fr;
    }
    WhatIfScreen #whatif-status {
        height: auto;
        color: $text-muted;
    }
    WhatIfScreen #whatif-status.error {
        color: $error;
    }
    """

    BINDINGS = [
        Binding("escape", "cancel", "close", tooltip="close the what-if (nothing is applied)"),
        Binding("ctrl+r", "replay", "replay", tooltip="replay the window under the edited thresholds"),
    ]

    def __init__(self, journal_path: str, since: float | None, until: float | None, *, window_text: str = "") -> None:
        super().__init__(classes="dialog-screen")
        self.journal_path = journal_path
        self.since = since
        self.until = until
        self.window_text = window_text
        self.window: Window | None = None
        #: KEY -> recorded value (the form's starting lines)
        self.recorded: dict[str, str] = {}
        #: the last answer shown (``run_replay``'s), and the proposal text it replayed
        self.answer: dict[str, Any] | None = None
        self.proposal = ""
        self.error: str | None = None
        self._run = 0

    def compose(self) -> ComposeResult:
        with Vertical(id="whatif-dialog", classes="dialog"):
            yield Static(f"What if: replay {self.window_text}", classes="dialog-title", markup=False)
            yield TextArea("", id="whatif-form", soft_wrap=False, show_line_numbers=False)
            yield Static("loading the window…", id="whatif-status", markup=False)
            table: DataTable[Text] = DataTable(id="whatif-table", zebra_stripes=True, cursor_type="row")
            yield table
            yield Static(
                "edit KEY=VALUE lines (as `tokengate replay --set`) · ctrl+r replays · esc closes · '?' = not trusted",
                classes="dialog-hint",
            )
            with Horizontal(classes="dialog-buttons"):
                yield Button("Replay", id="whatif-replay", variant="success", disabled=True)
                yield Button("Close", id="whatif-close")

    def on_mount(self) -> None:
        self.run_worker(self._load_thread, thread=True, group="whatif-load", exit_on_error=False)

    # ---- workers (threads: reading and replaying take seconds) ----------------------------

    def _load_thread(self) -> Window:
        return load_window(self.journal_path, self.since, self.until)

    def _replay_thread(self, window: Window, text: str, run: int) -> tuple[int, str, dict[str, Any]]:
        proposals = [proposal_from_set(text, window.config)] if text else []
        return run, text, run_replay(window, proposals)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        event.stop()
        if event.state == WorkerState.SUCCESS and worker.group == "whatif-load":
            window = worker.result
            assert isinstance(window, Window)
            self.window = window
            pairs = settable(window.config, window.fit.ceiling)
            self.recorded = dict(pairs)
            self.query_one("#whatif-form", TextArea).text = "\n".join(f"{k}={v}" for k, v in pairs)
            self.query_one("#whatif-replay", Button).disabled = False
            self._status(f"{len(window.arrivals):,} arrivals, backend {window.backend}; edit a threshold, then ctrl+r")
            self.query_one("#whatif-form", TextArea).focus()
        elif event.state == WorkerState.SUCCESS and worker.group == "whatif-replay":
            result = worker.result
            assert isinstance(result, tuple)
            run, text, answer = result
            if run != self._run:
                return  # an older run's answer: a newer one is on its way
            self.answer, self.proposal = answer, text
            self._fill(answer)
            untrusted = len(answer["scenarios"][1]["untrusted"])
            what = f"proposal {text}" if text else "no change from the recorded thresholds (calibration only)"
            self._status(f"{what} · {untrusted} figures not trusted ('?': calibration error over 25%)")
        elif event.state == WorkerState.ERROR:
            error = worker.error
            message = str(error) if isinstance(error, ReplayError | ValueError) else f"{type(error).__name__}: {error}"
            prefix = "cannot replay this window: " if worker.group == "whatif-load" else "replay failed: "
            self._status(prefix + message, error=True)

    # ---- view ---------------------------------------------------------------------

    def _status(self, text: str, *, error: bool = False) -> None:
        status = self.query_one("#whatif-status", Static)
        self.error = text if error else None
        status.set_class(error, "error")
        status.update(text)

    def _fill(self, answer: dict[str, Any]) -> None:
        head, rows = table_cells(answer)
        table = self.query_one("#whatif-table", DataTable)
        table.clear(columns=True)
        for i, label in enumerate(head):
            table.add_column(label, key=f"c{i}")
        for cells, untrusted in rows:
            style = "dim" if untrusted else ""
            table.add_row(*(Text(c, style=style if i >= 2 else "", justify="right" if i >= 2 else "left") for i, c in enumerate(cells)))

    @property
    def table_rows(self) -> list[list[str]]:
        """The table as shown (plain strings), for tests and screenshots."""
        table = self.query_one("#whatif-table", DataTable)
        return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]

    # ---- actions --------------------------------------------------------------------

    def action_replay(self) -> None:
        if self.window is None:
            self.notify("the window is still loading (or cannot be replayed)", severity="warning", timeout=3)
            return
        try:
            text = proposal_text(self.query_one("#whatif-form", TextArea).text, self.recorded)
            if text:
                proposal_from_set(text, self.window.config)  # checked here: a typo is said at once
        except ValueError as e:
            self._status(f"proposal not replayed: {e}", error=True)
            return
        self._run += 1
        self._status(f"replaying {len(self.window.arrivals):,} arrivals" + (f" under {text}" if text else "") + " …")
        self.run_worker(
            partial(self._replay_thread, self.window, text, self._run),
            thread=True,
            group="whatif-replay",
            exit_on_error=False,
        )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "whatif-replay":
            self.action_replay()
        else:
            self.action_cancel()

    def action_cancel(self) -> None:
        self.dismiss(None)
