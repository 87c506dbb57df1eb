"""`mpiexec -n N python bench/allreduce.py [options]` runs `hybridmpi bench allreduce [options]`.

See bench/README.md and `hybridmpi bench allreduce --help`.
"""

import sys

from hybridmpi.tools.cli import main

sys.exit(main(["bench", "allreduce", *sys.argv[1:]]))
