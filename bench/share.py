"""`mpiexec -n N python bench/share.py [options]` runs `hybridmpi bench share [options]`.

See bench/README.md and `hybridmpi bench share --help`.
"""

import sys

from hybridmpi.tools.cli import main

sys.exit(main(["bench", "share", *sys.argv[1:]]))
