from setuptools import Extension, setup

setup(cffi_modules=["cext/build_shim.py:ffibuilder"],
      # the profile's call wrapper (hybridmpi/profile.py works without it, slower)
      ext_modules=[Extension("hybridmpi._timed", ["cext/hm_timed.c"], extra_compile_args=["-O2"])])
