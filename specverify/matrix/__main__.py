"""`python -m specverify.matrix ...`: the matrix command without the rest of the CLI."""

import sys

from specverify.matrix import main

sys.exit(main())
