"""tokengate: a token-aware admission gate for llama.cpp's llama-server."""

__version__ = "0.1.0"
