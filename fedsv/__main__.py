"""`python -m fedsv` runs the fedsv command line."""

import sys

from fedsv.app.cli import main

sys.exit(main())
