"""`python -m specverify.golden ...`: the golden command without the rest of the CLI."""

import sys

from specverify.environment import readable_output
from specverify.golden import main

readable_output()
sys.exit(main())
