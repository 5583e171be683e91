"""``tokengate replay``: what would a recorded window have looked like under other thresholds?

It re-runs the window's recorded arrivals through the gate's own pure admission core and a
model of llama-server fitted from the same journal, first under the thresholds recorded as in
force (calibration: compared with what the journal says happened), then under each proposal.

One module per concept; the flow is window (I/O) -> engine (pure) -> report (pure):

``window``
    :func:`load_window` reads a journal window (read-only), refuses one that cannot be
    replayed (:class:`ReplayError`: schema before v4, rows before the migration, dropped
    rows, no ``config_in_force`` row) and fits :class:`BackendFit` from it.
``engine``
    :func:`replay`, the deterministic discrete-event loop around ``gate.core``.
``report``
    proposals (``--set``, ``--config``), per-class figures, calibration, ``untrusted``, and
    the table and JSON answers (:func:`run_replay`).
``workers``
    the engine's runs on worker processes side by side (``run_replay(jobs=N)``).
``isolated``
    :class:`ReplayProcess`: a window loaded and replayed in a child process, so that the
    console's process (which may run the gate) runs none of it.
``apply``
    what applying a proposal does on the running gate that the replay did not run (the
    reservations in force on the gate's ceiling, not the proposed budget): the what-if's
    confirmation.

This package's names are the one entry point the console may import beyond the journal
reader (the review screen's what-if, console/screens/whatif.py; tests/unit/test_layers.py).
"""

from __future__ import annotations

from gate.tools.replay.apply import ClassShare, scaled_apart, short_reach
from gate.tools.replay.engine import Arrival, BackendFit, Change, Outcome, replay
from gate.tools.replay.isolated import ReplayCancelled, ReplayProcess
from gate.tools.replay.report import (
    UNTRUSTED_ABOVE,
    Proposal,
    budget_lines,
    calibration,
    figures,
    model_line,
    plain_value,
    proposal_from_config,
    proposal_from_set,
    run_replay,
    settable,
    table_cells,
    to_json,
    to_table,
    untrusted,
)
from gate.tools.replay.window import ReplayError, Window, fit_backend, load_window

__all__ = [
    "UNTRUSTED_ABOVE",
    "Arrival",
    "BackendFit",
    "Change",
    "ClassShare",
    "Outcome",
    "Proposal",
    "ReplayCancelled",
    "ReplayError",
    "ReplayProcess",
    "Window",
    "budget_lines",
    "calibration",
    "figures",
    "fit_backend",
    "load_window",
    "model_line",
    "plain_value",
    "proposal_from_config",
    "proposal_from_set",
    "replay",
    "run_replay",
    "scaled_apart",
    "settable",
    "short_reach",
    "table_cells",
    "to_json",
    "to_table",
    "untrusted",
]
