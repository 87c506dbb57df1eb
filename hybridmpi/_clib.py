"""Loads the compiled C core and checks that it can work across processes."""

from ._core import ffi, lib

if not lib.hm_lock_free():
    raise ImportError(
        "hybridmpi: 64-bit atomics are not lock-free on this machine; they cannot "
        "synchronize processes through shared memory"
    )


def copy_policy(dst, src):
    """Copy a wait policy (spin, yield, sleep, timeout, warning, memory order) into a C struct's."""
    for field in ("spin", "yield_ns", "sleep_ns", "timeout_ns", "warn_ns", "order"):
        setattr(dst, field, getattr(src, field))


__all__ = ["copy_policy", "ffi", "lib"]
