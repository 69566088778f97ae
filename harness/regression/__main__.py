"""``python -m harness.regression`` (see :mod:`harness.regression.cli`)."""

import sys

from harness.regression.cli import main

sys.exit(main())
