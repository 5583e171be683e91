"""Plain versioned data that crosses a boundary: decision and audit records, the console
snapshot, operator commands, the control socket's wire format, the endpoint kinds.

May know: the standard library and `gate.core` (reason codes). Frozen dataclasses and their
encoders only: no I/O, no clock, no behaviour beyond describing and converting values.
"""
