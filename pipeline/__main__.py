"""``python -m pipeline``: the Epochal CLI."""
import sys

from pipeline.cli import main

sys.exit(main())
