"""Loads the native core: the C core (``_core``, through cffi) and its call objects
(``_calls``, a CPython extension), and checks that it can work across processes."""

from collections.abc import Callable
from typing import TypeVar

from ._calls import Calls, Coll, Hot, Near, Op, State, set_clock
from ._core import ffi, lib

if not lib.hm_lock_free():
    raise ImportError(
        "hybridmpi: 64-bit atomics are not lock-free on this machine; they cannot "
        "synchronize processes through shared memory"
    )

# the profile's clock, which a recorded operation reads (the C core's, in another shared object)
set_clock(*(int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))
            for name in ("hm_prof_begin", "hm_prof_end_bytes", "hm_prof_abort")))

T = TypeVar("T", bound=type)


def operations(*names: str) -> Callable[[T], T]:
    """Class decorator: each of ``names`` (a method of the class or of a base) becomes an
    operation of the class (an ``Op``: one C call).  An instance serves it with the C call
    object its ``_calls`` table (a ``Calls`` of ``OPERATIONS``) holds for it, else with the
    method; a profile records it through that table.  The class declares ``__slots__ =
    ("_calls",)`` and sets ``self._calls = Calls(self.OPERATIONS)``."""
    def declare(cls: T) -> T:
        for i, name in enumerate(names):
            setattr(cls, name, Op(cls, getattr(cls, name), i))
        cls.OPERATIONS = names  # type: ignore[attr-defined]
        return cls
    return declare


def copy_policy(dst, src):
    """Copy a wait policy (spin, yield, sleep, timeout, warning, memory order) into a C struct's."""
    for field in ("spin", "yield_ns", "sleep_ns", "timeout_ns", "warn_ns", "order"):
        setattr(dst, field, getattr(src, field))


__all__ = ["Calls", "Coll", "Hot", "Near", "Op", "State", "copy_policy", "ffi", "lib", "operations",
           "set_clock"]
