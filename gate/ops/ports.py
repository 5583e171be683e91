"""What the operator layer needs of a running gate, declared here, where it is used.

The control socket and the in-process link serve consoles; they are handed a `ConsoleHost`
by the composition root (the service is one) and read nothing else of it. Declaring the
port here keeps the arrow pointing down: ops never imports the service that builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gate.config import Config
from gate.data.commands import Operator
from gate.data.records import AuditRecord
from gate.data.snapshot import GateSnapshot, Label

if TYPE_CHECKING:
    from gate.ops.control import Control


class ConsoleHost(Protocol):
    """A gate as a console sees it: its facts, a snapshot, the control API, the audit feed."""

    gate_id: str
    label: Label
    host: str
    port: int | None
    journal_path: str
    drain_grace_s: float
    operator: Operator
    #: called with every audit row; a console's link adds itself and removes itself
    audit_listeners: list[Callable[[AuditRecord], None]]
    #: set by whoever runs the gate until told to stop; None when no console may stop it
    stop_requested: Callable[[str], None] | None

    @property
    def config(self) -> Config: ...

    @property
    def control(self) -> Control: ...

    def snapshot(self, decisions_after: int = 0, max_decisions: int = 200) -> GateSnapshot: ...
