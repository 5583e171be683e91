"""The Textual operator console for tokengate."""
