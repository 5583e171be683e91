"""One llama-server: its capacity unit and the pool of them, the one HTTP client that
owns base URL, auth, the router-mode query and timeouts, the gatekeeper (the async shell around
the core and the only way to change it), the upstream relay, token counting, telemetry.

May know: `gate.core`, `gate.data`, `gate.config`. Not the HTTP server, the fleet, the
observers or the operator layer: they sit above and call down.
"""
