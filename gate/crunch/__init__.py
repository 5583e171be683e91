"""``tokengate crunch``. Moved from gate/crunch.py to gate/crunch/runner.py as it is, so that
history follows; the next commit splits it into one module per concept."""

from gate.crunch.runner import *  # noqa: F403
from gate.crunch.runner import (  # noqa: F401 - public, but not in __all__
    DEFAULT_SLO_TTFT_MS,
    ENDPOINT_PATHS,
    Endpoint,
    __all__,
    breach_reasons,
    rotated_text,
    write_json,
)
