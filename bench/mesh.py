"""`mpiexec -n N python bench/mesh.py [options]` runs `hybridmpi bench mesh [options]`.

See bench/README.md and `hybridmpi bench mesh --help`.
"""

import sys

from hybridmpi.tools.cli import main

sys.exit(main(["bench", "mesh", *sys.argv[1:]]))
