"""The admission core: PURE decisions, no I/O.

May know: the standard library, and nothing else of tokengate. Reads no clock: every method that
needs the time takes `now` (the caller owns the clock, so tests and the simulator pin it). No
asyncio, no sockets, no files, no logging. Here: the reasons and the one error type, the ledger,
the per-class queues, admission (the F/E/A invariants), rate limits, the budget controllers
(adaptive, and the fixed budget with the same interface), the prefill model, shedding, the
rollups, the router-mode planner. Everything above reuses it: the gate, the simulator, crunch and
the benchmarks.
"""
