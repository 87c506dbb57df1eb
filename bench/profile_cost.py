"""`mpiexec -n N python bench/profile_cost.py [options]` runs `hybridmpi bench profile [options]`.

See bench/README.md and `hybridmpi bench profile --help`.
"""

import sys

from hybridmpi.tools.cli import main

sys.exit(main(["bench", "profile", *sys.argv[1:]]))
