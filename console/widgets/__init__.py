"""Console widgets, one per file (import them from their modules)."""
