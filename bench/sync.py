"""`mpiexec -n N python bench/sync.py [options]` runs `hybridmpi bench sync [options]`.

See bench/README.md and `hybridmpi bench sync --help`.
"""

import sys

from hybridmpi.tools.cli import main

sys.exit(main(["bench", "sync", *sys.argv[1:]]))
