"""tokengate configuration. Moved from gate/config.py to gate/config/reader.py as it is, so that
history follows; the next commit splits it into one module per concept."""

from gate.config.reader import *  # noqa: F403
from gate.config.reader import __all__  # noqa: F401
