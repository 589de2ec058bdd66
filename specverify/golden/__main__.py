"""`python -m specverify.golden ...`: the golden command without the rest of the CLI."""

import sys

from specverify.golden import main

sys.exit(main())
