import os
import runpy

from setuptools import Extension, setup

# HYBRIDMPI_SANITIZE=1 builds both compiled modules with ASan and UBSan (the flags: the builder's)
BUILDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cext", "build_shim.py")
SANITIZE = runpy.run_path(BUILDER)["SANITIZE"]

setup(cffi_modules=["cext/build_shim.py:ffibuilder"],
      # the operations as C call objects (cext/hm_calls*.c: one file per object)
      ext_modules=[Extension("hybridmpi._native._calls",
                             [f"cext/hm_calls{part}.c" for part in ("", "_op", "_coll", "_halo", "_near")],
                             include_dirs=["cext"],
                             extra_compile_args=["-O2", *SANITIZE],
                             extra_link_args=SANITIZE)])
