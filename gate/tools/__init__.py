"""Programs beside the gate: the llama-server simulator, crunch (calibration), the
synthetic traffic generator, the demo set-up.

May know: every layer below. The gate itself never imports them (the service builds the demo
when asked to).
"""
