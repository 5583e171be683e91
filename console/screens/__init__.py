"""Console screens, one per file (import them from their modules)."""
