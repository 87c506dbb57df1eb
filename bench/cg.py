"""`mpiexec -n N python bench/cg.py [options]` runs `hybridmpi bench cg [options]`.

See bench/README.md and `hybridmpi bench cg --help`.
"""

import sys

from hybridmpi.tools.cli import main

sys.exit(main(["bench", "cg", *sys.argv[1:]]))
