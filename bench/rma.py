"""`mpiexec -n N python bench/rma.py [options]` runs `hybridmpi bench rma [options]`.

See bench/README.md and `hybridmpi bench rma --help`.
"""

import sys

from hybridmpi.tools.cli import main

sys.exit(main(["bench", "rma", *sys.argv[1:]]))
