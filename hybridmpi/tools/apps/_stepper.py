"""The time-stepping loop both stencil applications share: halo exchange around the inner
cells and the shell, timed part by part."""

import time


def boxes(owned, full=()):
    """Split the owned cells (array indices 1..n along each decomposed axis) into the inner
    box (not next to a halo) and the shell slabs around it, which together cover them once.

    Returns:
        (inner, shell): an index tuple and a list of index tuples (the ``full`` axes span
        their cells 1..n-2).
    """
    tail = tuple(slice(1, n - 1) for n in full)
    inner = tuple(slice(2, max(2, n)) for n in owned) + tail
    shell = []
    for a, n in enumerate(owned):
        planes = sorted({1, n})  # the first and last owned planes (one when n == 1)
        for p in planes:
            box = []
            for b, m in enumerate(owned):
                if b < a:
                    box.append(slice(2, max(2, m)))
                elif b == a:
                    box.append(slice(p, p + 1))
                else:
                    box.append(slice(1, m + 1))
            shell.append(tuple(box) + tail)
    return inner, shell


class Stepper:
    """Runs steps of ``update(Y, X, box)`` with an exchange, keeping per-part times.

    Attributes:
        times: seconds spent in the halo exchange, the computation and the reduction.
        step_count: steps run.
    """

    def __init__(self, exchange, arrays, owned, full=()):
        self.ex = exchange
        self.arrays = arrays
        self.inner, self.shell = boxes(owned, full)
        self.step_count = 0
        self.times = {"halo": 0.0, "compute": 0.0, "reduce": 0.0}
        #: with a list here, each step appends the monotonic times (ns) of entering and
        #: leaving its three exchange parts (hybridmpi.profiling.waits.split_waits splits them)
        self.marks = None

    @property
    def current(self):
        return self.arrays[self.step_count % 2]

    def step(self, update):
        """One step: fill X's halos (around the inner cells when the exchange overlaps),
        write Y, push Y's planes; returns (X, Y)."""
        x = self.arrays[self.step_count % 2]
        y = self.arrays[(self.step_count + 1) % 2]
        ex = self.ex
        clock = time.perf_counter if self.marks is None else time.monotonic
        t0 = clock()
        ex.before(x)
        t1 = clock()
        update(y, x, self.inner)
        t2 = clock()
        ex.middle(x)
        t3 = clock()
        for box in self.shell:
            update(y, x, box)
        t4 = clock()
        ex.after(y)
        t5 = clock()
        self.times["halo"] += (t1 - t0) + (t3 - t2) + (t5 - t4)
        if self.marks is not None:
            self.marks.append((t0, t1, t2, t3, t4, t5))
        self.times["compute"] += (t2 - t1) + (t4 - t3)
        self.step_count += 1
        return x, y

    def reduce(self, call):
        t0 = time.perf_counter()
        value = call()
        self.times["reduce"] += time.perf_counter() - t0
        return value


def interior(nd, full=()):
    """Index of every owned cell."""
    return tuple(slice(1, -1) for _ in range(nd)) + tuple(slice(1, n - 1) for n in full)


def start_arrays(exchange, init):
    """The exchange's two arrays, each filled by ``init(array)`` (halos included)."""
    xs = exchange.arrays()
    for x in xs:
        init(x)
    return xs


def check_names(name, allowed, what):
    if name not in allowed:
        raise ValueError(f"hybridmpi: {what}: unknown exchange {name!r}; use one of {list(allowed)}")

