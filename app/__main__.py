"""``python -m app`` behaves like ``servekit``."""

import sys

from app.cli import main

sys.exit(main())
