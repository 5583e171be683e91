"""Per-API request adapters: each API's body checks and cost model (its tasks and their tokens)."""
