"""`mpiexec -n N python bench/dolfinx_heat.py [options]` runs `hybridmpi bench dolfinx [options]`.

See bench/README.md and `hybridmpi bench dolfinx --help`.
"""

import sys

from hybridmpi.tools.cli import main

sys.exit(main(["bench", "dolfinx", *sys.argv[1:]]))
