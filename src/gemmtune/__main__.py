"""`python -m gemmtune ...`: the `gemmtune` command."""

import sys

from .cli import main

sys.exit(main())
