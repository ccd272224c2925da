"""`python -m kvscope.app.cli`: the same entry point as the `kvscope` script."""

import sys

from kvscope.app.cli.main import main

sys.exit(main())
