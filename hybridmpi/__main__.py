"""``python -m hybridmpi``: the hybridmpi command (hybridmpi.tools.cli)."""

import sys

from .tools.cli import main

sys.exit(main())
