"""``python -m gate``: the ``tokengate`` command, for a checkout run without installing it."""

import sys

from gate.cli import main

sys.exit(main())
