"""The SQLite journal. Moved from gate/journal.py to gate/journal/writer.py as it is, so that
history follows; the next commit splits it into one module per concept."""

from gate.journal.writer import *  # noqa: F403
