"""`mpiexec -n N python bench/heat3d.py [options]` runs `hybridmpi bench heat3d [options]`.

See bench/README.md and `hybridmpi bench heat3d --help`.
"""

import sys

from hybridmpi.tools.cli import main

sys.exit(main(["bench", "heat3d", *sys.argv[1:]]))
