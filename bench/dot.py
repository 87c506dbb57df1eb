"""`mpiexec -n N python bench/dot.py [options]` runs `hybridmpi bench dot [options]`.

See bench/README.md and `hybridmpi bench dot --help`.
"""

import sys

from hybridmpi.tools.cli import main

sys.exit(main(["bench", "dot", *sys.argv[1:]]))
