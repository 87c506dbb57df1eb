"""``python -m hybridmpi``: the hybridmpi command."""

import sys

from .cli import main

sys.exit(main())
