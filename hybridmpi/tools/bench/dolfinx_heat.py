"""``hybridmpi bench dolfinx``: the explicit heat program of examples/dolfinx_heat.py, its ghost
updates done by DOLFINx's scatters and by a hybridmpi Halo on DOLFINx's IndexMap, in one run.

Each step assembles the action of the stiffness form on u (DOLFINx), accumulates the ghost
contributions into their owners (reverse, add), updates the owned values and refreshes the
ghosts of u (forward).  Both variants start from the same u; their final u must have the same
bits (``identical`` in the JSON).  A barrier before each ghost update (outside its timing)
keeps the ranks' assembly imbalance out of the ghost-update time.  Per repetition, each
variant runs the given steps (the order alternates between repetitions); per step: the
ghost-update time (max over ranks) and the whole step.  Rows: ``dolfinx ghost`` (the
baseline), ``hybridmpi ghost`` (ratio to it), ``dolfinx step``, ``hybridmpi step``;
``slower_steps``: steps in which the library's ghost updates took longer than DOLFINx's of
the same step number.
"""

import time

import numpy as np

from ...ghost.halo import Halo
from ...ghost.pattern import GhostPattern
from ._common import Progress, add, document


def arguments(p):
    p.add_argument("--n", type=int, default=40, help="cells per side of the unit cube")
    p.add_argument("--bs", type=int, default=1, help="values per point (1: scalar P1, 2-3: vector)")
    p.add_argument("--steps", type=int, default=20, help="steps per repetition")
    p.add_argument("--reps", type=int, default=5, help="repetitions")


def _problem(comm, n, bs):
    import ufl
    from dolfinx import fem, la, mesh

    msh = mesh.create_unit_cube(comm, n, n, n)
    V = (fem.FunctionSpace(msh, ("Lagrange", 1)) if bs == 1
         else fem.VectorFunctionSpace(msh, ("Lagrange", 1), dim=bs))
    u = fem.Function(V)
    if bs == 1:
        u.interpolate(lambda x: np.sin(np.pi * x[0]) * np.sin(np.pi * x[1]) * np.sin(np.pi * x[2]))
    else:
        u.interpolate(lambda x: np.tile(np.sin(np.pi * x[0]) * np.sin(np.pi * x[1]), (bs, 1)))
    v = ufl.TestFunction(V)
    action = fem.form(ufl.inner(ufl.grad(u), ufl.grad(v)) * ufl.dx)
    one = ufl.as_vector([1.0] * bs) if bs > 1 else 1.0
    lumped = fem.assemble_vector(fem.form(ufl.inner(one, v) * ufl.dx))
    lumped.scatter_reverse(la.ScatterMode.add)
    b = la.vector(V.dofmap.index_map, V.dofmap.index_map_bs)
    return V, u, action, lumped, b


def _steps(which, hc, halo, u, action, lumped, b, n_owned, dt, steps):
    """Run ``steps`` steps; per step (ghost-update seconds, step seconds).  A barrier (not
    timed) before each ghost update keeps the ranks' assembly imbalance out of its time."""
    from dolfinx import fem, la

    out = []
    # DOLFINx makes a new numpy object at each `.array`: taken once, the Halo's calls take
    # their hot path (the same array object as last time)
    barr, uarr, m = b.array, u.x.array, lumped.array[:n_owned]
    for _ in range(steps):
        t0 = time.perf_counter()
        barr[:] = 0
        fem.assemble_vector(barr, action)
        hc.barrier()
        t1 = time.perf_counter()
        if which == "hybridmpi":
            halo.reverse(barr, "add")
        else:
            b.scatter_reverse(la.ScatterMode.add)
        t2 = time.perf_counter()
        uarr[:n_owned] -= dt * barr[:n_owned] / m
        hc.barrier()
        t3 = time.perf_counter()
        if which == "hybridmpi":
            halo.update(uarr)
        else:
            u.x.scatter_forward()
        t4 = time.perf_counter()
        out.append((t2 - t1 + t4 - t3, t4 - t0))
    return out


def run(hc, comm, a):
    from mpi4py import MPI

    try:
        import dolfinx  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"hybridmpi bench dolfinx: dolfinx does not import ({e}); it runs on the "
                         "system stack (docs/getting-started.md: the system stack)") from None
    if a.n < 2 or a.bs not in (1, 2, 3) or a.steps < 1 or a.reps < 1:
        raise SystemExit("hybridmpi bench dolfinx: --n >= 2, --bs 1-3, --steps and --reps >= 1")
    V, u, action, lumped, b = _problem(comm, a.n, a.bs)
    imap, bs = V.dofmap.index_map, V.dofmap.index_map_bs
    n_owned = imap.size_local * bs
    pattern = GhostPattern.from_index_map(hc, imap)
    halo = Halo(pattern, block=bs)
    dt = 0.1 / a.n ** 2
    u0 = u.x.array.copy()
    kb = [len(ids) * bs * 8 / 1000 for ids in pattern.recv.values()]
    per_neighbor = comm.allreduce(max(kb, default=0.0), op=MPI.MAX)
    doc = document("dolfinx", "explicit heat in DOLFINx: ghost updates (reverse add + forward) "
                   "and whole step per step (us), DOLFINx's scatters vs a hybridmpi Halo",
                   "series", hc, None, reps=a.reps, steps=a.steps, n=a.n, bs=bs,
                   dofs=int(imap.size_global * bs), max_kb_per_neighbor=per_neighbor)
    bar = Progress(comm, 2 * a.reps, "dolfinx")
    times = {"dolfinx": [], "hybridmpi": []}
    finals = {}
    for rep in range(a.reps + 1):  # the first is a warm-up
        order = ("dolfinx", "hybridmpi") if rep % 2 else ("hybridmpi", "dolfinx")
        for which in order:
            u.x.array[:] = u0
            hc.barrier()
            got = np.array(_steps(which, hc, halo, u, action, lumped, b, n_owned, dt, a.steps))
            comm.Allreduce(MPI.IN_PLACE, got, op=MPI.MAX)
            if rep:
                times[which].append(got)
                bar.step(which)
            finals[which] = u.x.array.copy()
    halo.free()
    same = int(np.array_equal(finals["dolfinx"], finals["hybridmpi"]))
    identical = bool(comm.allreduce(same, op=MPI.MIN))
    per = {w: np.concatenate(t) for w, t in times.items()}  # (reps * steps, 2) seconds
    slower = int(np.sum(per["hybridmpi"][:, 0] > per["dolfinx"][:, 0]))
    for w in ("dolfinx", "hybridmpi"):
        ghost = [float(np.median(t[:, 0])) * 1e6 for t in times[w]]
        step = [float(np.median(t[:, 1])) * 1e6 for t in times[w]]
        add(doc, f"{w} ghost", "ghost", ghost, baseline=w == "dolfinx")
        add(doc, f"{w} step", "step", step, baseline=w == "dolfinx")
    doc["identical"] = identical
    doc["slower_steps"] = slower
    doc["steps_compared"] = int(per["dolfinx"].shape[0])
    doc["notes"] = [f"{imap.size_global * bs} dofs, at most {per_neighbor:.1f} kB per neighbour; "
                    f"same bits: {identical}; steps where the library's ghost updates were slower: "
                    f"{slower} of {per['dolfinx'].shape[0]}"]
    return doc
