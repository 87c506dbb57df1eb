"""Loads the compiled C core and checks that it can work across processes."""

from ._core import ffi, lib

if not lib.hm_lock_free():
    raise ImportError(
        "hybridmpi: 64-bit atomics are not lock-free on this machine; they cannot "
        "synchronize processes through shared memory"
    )

__all__ = ["ffi", "lib"]
