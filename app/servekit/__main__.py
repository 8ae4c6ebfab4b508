"""``python -m servekit`` behaves like ``servekit``."""

import sys

from servekit.cli import main

sys.exit(main())
