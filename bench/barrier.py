"""`mpiexec -n N python bench/barrier.py [options]` runs `hybridmpi bench barrier [options]`.

See bench/README.md and `hybridmpi bench barrier --help`.
"""

import sys

from hybridmpi.tools.cli import main

sys.exit(main(["bench", "barrier", *sys.argv[1:]]))
