"""Keep BLAS to one thread per rank in the hybridmpi command's MPI jobs.

Several ranks per node each running a multithreaded OpenBLAS oversubscribe
the cores; on the 2-core development machine that made a CG iteration 60
times slower.  The environment variables only act before numpy loads its
BLAS, so the command sets the thread count through the library itself.
"""

import ctypes

from . import settings

_SETTERS = ("openblas_set_num_threads", "openblas_set_num_threads64_",
            "scipy_openblas_set_num_threads", "scipy_openblas_set_num_threads64_")


def limit_blas_threads(n=1):
    """Set every loaded OpenBLAS to ``n`` threads unless the user chose a count.

    Returns the number of libraries changed (0 where none is found, or the
    environment already says how many threads to use).
    """
    if settings.threads_set():
        return 0
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        return 0
    changed = 0
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                changed += 1
                break
    return changed
