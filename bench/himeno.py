"""`mpiexec -n N python bench/himeno.py [options]` runs `hybridmpi bench himeno [options]`.

See bench/README.md and `hybridmpi bench himeno --help`.
"""

import sys

from hybridmpi.tools.cli import main

sys.exit(main(["bench", "himeno", *sys.argv[1:]]))
