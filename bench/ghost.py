"""`mpiexec -n N python bench/ghost.py [options]` runs `hybridmpi bench ghost [options]`.

See bench/README.md and `hybridmpi bench ghost --help`.
"""

import sys

from hybridmpi.tools.cli import main

sys.exit(main(["bench", "ghost", *sys.argv[1:]]))
