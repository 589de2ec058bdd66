"""`python -m specverify.matrix ...`: the matrix command without the rest of the CLI."""

import sys

from specverify.environment import readable_output
from specverify.matrix import main

readable_output()
sys.exit(main())
