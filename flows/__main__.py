"""`python -m flows ...` is the `ballast` CLI."""

import sys

from flows.cli import main

sys.exit(main())
