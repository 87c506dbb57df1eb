from setuptools import setup

setup(cffi_modules=["cext/build_shim.py:ffibuilder"])
