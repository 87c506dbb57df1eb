"""Loads the compiled C core and checks that it can work across processes."""

from ._core import ffi, lib

if not lib.hm_lock_free():
    raise ImportError(
        "hybridmpi: 64-bit atomics are not lock-free on this machine; they cannot "
        "synchronize processes through shared memory"
    )


#: error bits of a counter (docs/protocol.md): the writer failed; the failure is a mismatch
ERRBIT = 1 << 62
MISBIT = 1 << 63


def copy_policy(dst, src):
    """Copy a wait policy (spin, yield, sleep, timeout, warning, memory order) into a C struct's."""
    for field in ("spin", "yield_ns", "sleep_ns", "timeout_ns", "warn_ns", "order"):
        setattr(dst, field, getattr(src, field))


__all__ = ["ERRBIT", "MISBIT", "copy_policy", "ffi", "lib"]
