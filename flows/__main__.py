"""`python -m flows ...` is the `ballast` CLI."""

import sys

from flows.cli.main import main

sys.exit(main())
