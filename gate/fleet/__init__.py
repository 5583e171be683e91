"""More than one llama-server or gate: router mode (a unit per model) and tenant limits
shared across gates through Redis.

May know: `gate.core`, `gate.data`, `gate.config`, `gate.backend`.
"""
