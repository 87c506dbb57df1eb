"""cffi builder for hybridmpi's private C core (API mode, out of line).

The declarations come from ``cext/hm_core.h``, the one header of the C core:
its integer ``#define`` constants stay (cffi exposes them, as ``lib.HM_MAX_RADIX``),
its other preprocessor lines are removed.  The compiled module is ``hybridmpi._core``.
"""

import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
#: HYBRIDMPI_SANITIZE=1: compile and link with AddressSanitizer and UndefinedBehaviorSanitizer
#: (setup.py adds the same to hybridmpi._timed; docs/development.md: how to run them).  Python
#: compiles extensions with -fwrapv, under which UBSan does not check signed overflow.
SANITIZE = (["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-wrapv", "-O1", "-g"]
            if os.environ.get("HYBRIDMPI_SANITIZE") == "1" else [])


_CONSTANT = re.compile(r"#define HM_[A-Z0-9_]+ -?[0-9]+\s*$")


def _cdef():
    with open(os.path.join(HERE, "hm_core.h")) as f:
        return "".join(line for line in f
                       if not line.lstrip().startswith("#") or _CONSTANT.match(line))


ffibuilder = FFI()
ffibuilder.cdef(_cdef() + 'extern "Python" void hm_py_progress(void);'
                'extern "Python" void hm_py_warn(const void *, uint64_t, uint64_t, double);')
ffibuilder.set_source(
    "hybridmpi._core",
    '#include "hm_core.h"',
    sources=[os.path.relpath(os.path.join(HERE, f))
             for f in ("hm_wait.c", "hm_core.c", "hm_halo.c", "hm_gm.c")],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=["-std=gnu11", "-O3", *SANITIZE],
    extra_link_args=SANITIZE,
    # The limited API makes every call from Python about twice as slow.
    py_limited_api=False,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
