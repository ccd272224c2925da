"""`python -m app.cli`: the same entry point as the `kvscope` script."""

import sys

from app.cli.main import main

sys.exit(main())
