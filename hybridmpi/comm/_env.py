"""What a HybridComm shares with its process: the environment settings it agrees on when it is
made (:func:`env_settings`) and the checks of its arguments, numbers of seconds for the C
core's waits, the C core's chaos hook and its warning of long waits, Ctrl-C held over a span in
which the ranks must stay together, and the comms not yet freed (:data:`LIVE`), which
MPI_Finalize frees."""

from __future__ import annotations

import contextlib
import signal
from typing import Any

import numpy as np

from .. import settings
from .._native import errmap as _errmap
from .._native.clib import ffi, lib
from .._native.tables import as_int
from ._agree import safe_repr

#: every HybridComm not yet freed, by id, in creation order (freed at MPI_Finalize)
LIVE: dict[int, Any] = {}
#: the keyval of the finalize hook, once installed
FINALIZE_HOOK: list[int] = []
#: the memory orders of a HybridComm's atomics, by name
ORDERS = {"acq_rel": lib.HM_ACQ_REL, "seq_cst": lib.HM_SEQ_CST}
#: the most polls a wait may spin (an int64 in the C core)
MAX_SPIN = 2**62
#: waits longer than this are waits without a limit (int64 nanoseconds end near 292 years)
FOREVER_S = 1e9


def seconds_ns(value):
    """Nanoseconds of a validated number of seconds for the C core (0: no limit)."""
    if value is None or value == 0 or value >= FOREVER_S:
        return 0
    return max(1, int(value * 1e9))


def check_seconds(value, what):
    """None, or the problem with a number of seconds (None or a number >= 0; inf: no limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or value != value or value < 0:
        return f"{what} must be a number of seconds >= 0 or None, got {safe_repr(value)}"
    return None


def env_settings():
    """The environment settings a HybridComm reads once (settings.per_comm): the values, or
    the problem with one of them (the ranks then agree on these values or raise)."""
    try:
        out = settings.per_comm()
    except ValueError as e:
        return None, str(e)
    problem = (check_seconds(out["timeout"], "env HYBRIDMPI_TIMEOUT")
               or check_seconds(out["warn_after"], "env HYBRIDMPI_WARN_AFTER"))
    if problem is None and out["spin"] is not None and out["spin"] < 0:
        problem = f"env HYBRIDMPI_SPIN must be >= 0, got {out['spin']}"
    return out, problem


@contextlib.contextmanager
def ctrl_c_deferred():
    """A first SIGINT (Ctrl-C) in the block is delivered when the block ends (in the main
    thread; elsewhere nothing changes), a second at once: MPI's own calls block without a
    deadline, so a rank that left the calibration between two of them on KeyboardInterrupt
    would leave its peers waiting in MPI for it; all ranks leave it together instead (mpiexec
    sends the signal to every rank)."""
    pending = []

    def later(signum, frame):
        if pending:
            raise KeyboardInterrupt
        pending.append(signum)

    try:
        old = signal.signal(signal.SIGINT, later)
    except (ValueError, TypeError):   # not the main thread, or a handler set outside Python
        old = None
    try:
        yield
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)
            if pending:
                signal.raise_signal(signal.SIGINT)


def chaos(rank):
    """Turn on the C core's chaos hook from env HYBRIDMPI_CHAOS=SEED[:MAX_US] (drift tests:
    random yields, spins and sleeps of up to MAX_US microseconds, default 200, at protocol
    points; each rank draws its own sequence)."""
    found = settings.chaos()
    if found is not None:
        seed, most = found
        lib.hm_set_chaos(seed * 7919 + rank + 1, int(most * 1000))


def check_args(node_size, memory_order, timeout, radix, spin):
    """This rank's problem with the arguments (None if none).  Integers may be numpy
    integers (not bools); nothing here raises, so every rank reaches the agreement."""
    if node_size is not None and (as_int(node_size) is None or node_size < 1):
        return f"node_size must be a positive int or None, got {safe_repr(node_size)}"
    if type(memory_order) is not str or memory_order not in ORDERS:
        return f"memory_order must be 'acq_rel' or 'seq_cst', got {safe_repr(memory_order)}"
    problem = check_seconds(timeout, "timeout")
    if problem:
        return problem
    if radix is not None and (as_int(radix) is None or not 2 <= radix <= lib.HM_MAX_RADIX):
        return (f"radix must be an int from 2 to {lib.HM_MAX_RADIX} or None, got "
                f"{safe_repr(radix)}")
    if spin is not None and (as_int(spin) is None or not 0 <= spin <= MAX_SPIN):
        return f"spin must be an int from 0 to {MAX_SPIN} or None, got {safe_repr(spin)}"
    return None


@ffi.def_extern()
def hm_py_warn(word, value, seen, waited):
    """Once per wait that lasts HYBRIDMPI_WARN_AFTER seconds: say on stderr what this rank
    waits for, and keep waiting (a hang is diagnosed even without a timeout)."""
    import sys

    addr = int(ffi.cast("uintptr_t", word))
    where = "a Halo, global-memory or sync_images call"
    for hc in LIVE.values():
        where = hc.context.describe_word(addr) or where
    rank = next((hc.rank for hc in LIVE.values()), "?")
    print(f"hybridmpi: rank {rank} has waited {waited:.0f} s in {where}: the word at {addr:#x} "
          f"reads {_errmap.describe_word_value(seen)}, it needs {value}; still waiting "
          "(HYBRIDMPI_WARN_AFTER)", file=sys.stderr, flush=True)


def _free_all_at_finalize(*_args):
    for hc in list(LIVE.values()):
        try:
            hc.free()
        except Exception as e:  # noqa: BLE001 - MPI_Finalize goes on; say what was left
            import sys

            print(f"hybridmpi: at MPI_Finalize, {hc!r} was not freed: {e}", file=sys.stderr)
    return 0


def install_finalize_hook(MPI):
    # Attributes of COMM_SELF are deleted first thing in MPI_Finalize, while
    # MPI still works: the standard place to release cached MPI objects.
    if FINALIZE_HOOK:
        return
    keyval = MPI.Comm.Create_keyval(delete_fn=_free_all_at_finalize)
    MPI.COMM_SELF.Set_attr(keyval, True)
    FINALIZE_HOOK.append(keyval)
