"""``python -m gangcheck_dev``: the development command line."""

import sys

from gangcheck_dev.cli import main

sys.exit(main())
