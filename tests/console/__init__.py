"""Console tests: Pilot tests and SVG snapshots (pytest-textual-snapshot)."""
