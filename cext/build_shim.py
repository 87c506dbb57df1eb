"""cffi builder for hybridmpi's private C core (API mode, out of line).

The declarations come from ``cext/hm_core.h``, the one header of the C core:
its ``#define HM_*`` constants stay (cffi exposes them, as ``lib.HM_MAX_RADIX``),
its other preprocessor lines are removed.  The compiled module is ``hybridmpi._native._core``.
"""

import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
#: HYBRIDMPI_SANITIZE=1: compile and link with AddressSanitizer and UndefinedBehaviorSanitizer
#: (setup.py adds the same to hybridmpi._native._calls; docs/development.md: how to run them).  Python
#: compiles extensions with -fwrapv, under which UBSan does not check signed overflow.
SANITIZE = (["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-wrapv", "-O1", "-g"]
            if os.environ.get("HYBRIDMPI_SANITIZE") == "1" else [])


_CONSTANT = re.compile(r"#define (HM_[A-Z0-9_]+) +(\S.*)$")


_PART = re.compile(r'#include "(hm_core_[a-z_]+\.h)"')


def _cdef(name="hm_core.h"):
    """hm_core.h without its preprocessor lines, but for its object-like ``#define HM_*``
    constants: a number as it is, an expression as ``#define HM_X ...`` (cffi takes its value
    from the compiler); its parts (``#include "hm_core_*.h"``) read in their place."""
    out = []
    with open(os.path.join(HERE, name)) as f:
        for line in f:
            if not line.lstrip().startswith("#"):
                out.append(line)
            elif part := _PART.match(line.strip()):
                out.append(_cdef(part.group(1)))
            elif m := _CONSTANT.match(line):   # a number stays (array sizes use it)
                value = m.group(2).strip()
                out.append(line if re.fullmatch(r"-?[0-9]+", value) else f"#define {m.group(1)} ...\n")
    return "".join(out)


ffibuilder = FFI()
ffibuilder.cdef(_cdef() + 'extern "Python" void hm_py_progress(void);'
                'extern "Python" void hm_py_warn(const void *, uint64_t, uint64_t, double);'
                'extern "Python" int hm_py_notice(void *);')
ffibuilder.set_source(
    "hybridmpi._native._core",
    '#include "hm_core.h"',
    sources=[os.path.relpath(os.path.join(HERE, f))
             for f in ("hm_wait.c", "hm_prof.c", "hm_chaos.c", "hm_coll.c", "hm_coll_node.c", "hm_ops.c",
                       "hm_net.c", "hm_halo.c", "hm_gm.c")],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=["-std=gnu11", "-O3", *SANITIZE],
    extra_link_args=SANITIZE,
    # The limited API makes every call from Python about twice as slow.
    py_limited_api=False,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
