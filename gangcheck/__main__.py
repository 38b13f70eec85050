import sys

from gangcheck.cli import main

sys.exit(main())
