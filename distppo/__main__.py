"""`python -m distppo ...`, the same as the `distppo` command."""
import sys

from distppo.cli.main import main

sys.exit(main())
