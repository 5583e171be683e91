"""``python -m gate``: the ``tokengate`` command, for a checkout run without installing it."""

import sys

from gate.cli import main

if __name__ == "__main__":  # not when a spawned worker process imports it (tokengate replay --jobs)
    sys.exit(main())
