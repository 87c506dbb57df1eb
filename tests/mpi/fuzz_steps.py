"""The fuzzer's valid steps: what each rank does and the values it must see (tests/mpi/fuzz.py)."""

import io
import os
import tempfile
import time

import numpy as np
from fuzz_common import P, PatModel, R, SkipCall, comm, data, diff, same_bits
from mpi4py import MPI

import hybridmpi


class Steps:
    """The valid steps of a Program (a mixin of fuzz.Program)."""

    def do_hc(self, st):
        env = {
            "default": {},
            "zc0": {"HYBRIDMPI_ZERO_COPY_BYTES": "0"},
            "cma0": {"HYBRIDMPI_CMA_BYTES": "0"},
            "both0": {"HYBRIDMPI_ZERO_COPY_BYTES": "0", "HYBRIDMPI_CMA_BYTES": "0"},
        }[st["env"]]
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        key = (st["i"], 0)
        try:
            cls, hc = self.call(
                key,
                lambda: hybridmpi.HybridComm(
                    comm,
                    node_size=self.cfg.node_size,
                    memory_order=st["memory_order"],
                    timeout=self.cfg.timeout,
                    radix=st["radix"],
                    allreduce=st["allreduce"],
                ),
                meta={"sync": True, "reset": bool(st.get("restart"))},
                pause=False,
            )
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.hc = hc
        self.prof_on = False
        self.prof = None
        self.pcount = {}

    def do_hc_free(self, st):
        # calls still pending (steps left out with --keep): ended first, in Halo order
        for j, (hid, s) in enumerate(sorted(self.shalo.items())):
            if s["pending"] is not None:
                self.do_hop(
                    {
                        "op": "hop",
                        "hid": hid,
                        "call": s["pending"]["call"].replace("begin", "end"),
                        "arr": "?",
                    },
                    key=(st["i"], 100 + j),
                )
        key = (st["i"], 0)
        if self.hc is None:
            return self.nocall(key, {"sync": True})
        # what lives at the comm's free: its arrays stay (written through, as every stale one)
        self.keep_stale([a for o in self.ohalo.values() for n, a in o["arrays"].items() if n.startswith("v")]
                        + [m.local for m in self.omem.values() if m is not None and not m.closed])
        self.call(key, self.hc.free, meta={"sync": False, "free": True})

    def do_after_free(self, st):
        """Every object of the freed HybridComm raises FreedError (or, if it broke, RuntimeError)."""
        if self.hc is None:
            return
        probes = [("barrier", lambda: self.hc.barrier()), ("allreduce", lambda: self.hc.allreduce(1.0))]
        for g in list(self.graveyard.values())[-1:]:
            probes.append(("Halo.update", lambda h=g["h"], x=g["x"]: h.update(x)))
        for pat in list(self.opat.values())[-1:]:
            probes.append(("Halo()", lambda pat=pat: hybridmpi.Halo(pat)))
        for mm in list(self.gm_graveyard.values())[-1:]:
            if mm is not None:
                probes.append(("GlobalMemory.Get", lambda mm=mm: mm.Get(np.empty(1, mm.dtype), R)))
        probes.append(("GlobalMemory()", lambda: hybridmpi.GlobalMemory(self.hc, 4)))
        probes.append(
            (
                "GhostPattern.from_global",
                lambda: hybridmpi.GhostPattern.from_global(self.hc, np.arange(1) + R, np.zeros(0, np.int64)),
            )
        )
        probes.append(("profile", lambda: hybridmpi.profile(self.hc).__enter__()))
        for j, (name, fn) in enumerate(probes):
            key = (st["i"], j)
            exp = ["FreedError"]
            self.call(
                key,
                fn,
                meta={
                    "misuse": True,
                    "mode": "all",
                    "bad": "all",
                    "mk": "after-free " + name,
                    "exp": exp,
                    "sync": False,
                },
            )

    # ------------------------------------------------------------ patterns and Halos

    def do_pattern(self, st):
        pid = st["pid"]
        pm = PatModel(st["spec"], P)
        self.pats[pid] = pm
        key = (st["i"], 0)

        def make():
            return self.make_pattern(pm, st["spec"])

        def check(pat, cls):
            if cls:
                return None
            if pat.size != pm.size[R]:
                return f"pattern size {pat.size}, model {pm.size[R]}"
            for q, (mine, _) in pm.fwd[R].items():
                if not np.array_equal(pat.recv.get(q), mine):
                    return f"recv[{q}] = {pat.recv.get(q)}, model {mine}"
            for q, (theirs, _) in pm.rev[R].items():
                if not np.array_equal(pat.send.get(q), theirs):
                    return f"send[{q}] = {pat.send.get(q)}, model {theirs}"
            if set(pat.send) != set(pm.rev[R]) or set(pat.recv) != set(pm.fwd[R]):
                return f"peers send {sorted(pat.send)} recv {sorted(pat.recv)}"
            return None

        cls, pat = self.call(key, make, check, vcat="pattern", meta={"sync": True})
        if pat is not None:
            self.opat[pid] = pat

    def make_pattern(self, pm, spec):
        if spec["kind"] == "global":
            return hybridmpi.GhostPattern.from_global(
                self.hc, np.array(spec["owned"][R], np.int64), np.array(spec["ghosts"][R], np.int64)
            )
        send, recv = pm.explicit_lists(R)
        return hybridmpi.GhostPattern(self.hc, send=send, recv=recv, size=pm.size[R])

    def do_halo(self, st):
        hid = st["hid"]
        self.shalo[hid] = {
            "pid": st["pid"],
            "dtype": st["dtype"],
            "block": st["block"],
            "method": st["method"],
            "nvec": 0,
            "pending": None,
            "calls": [0, 0],
        }
        key = (st["i"], 0)
        pat = self.opat.get(st["pid"])
        if pat is None:
            return self.call(key, lambda: self.skip(), meta={"sync": True})
        cls, h = self.call(
            key,
            lambda: hybridmpi.Halo(pat, dtype=np.dtype(st["dtype"]), block=st["block"], method=st["method"]),
            meta={"sync": True},
        )
        if h is not None:
            pm = self.pats[st["pid"]]
            n, b = pm.size[R], st["block"]
            shape = (n,) if b == 1 else (n, b)
            alt = (n, 1) if b == 1 else (n * b,)
            dt = np.dtype(st["dtype"])
            self.ohalo[hid] = {
                "h": h,
                "arrays": {"k0": np.zeros(shape, dt), "k1": np.zeros(shape, dt), "ka": np.zeros(alt, dt)},
                "shape": shape,
                "alt": alt,
            }

    def skip(self):
        raise SkipCall("an object this call needs was not made on this rank")

    def do_vector(self, st):
        hid = st["hid"]
        s = self.shalo[hid]
        name = f"v{s['nvec']}"
        s["nvec"] += 1
        key = (st["i"], 0)
        o = self.ohalo.get(hid)
        if o is None:
            return self.call(key, self.skip, meta={"sync": True})
        pm = self.pats[s["pid"]]

        def check(v, cls):
            if cls:
                return None
            if v.shape != o["shape"] or v.dtype != np.dtype(s["dtype"]) or np.any(v != 0):
                return (
                    f"vector() of shape {v.shape} dtype {v.dtype}, zeroed: {not np.any(v != 0)}; "
                    f"want {o['shape']}"
                )
            return None

        cls, v = self.call(key, o["h"].vector, check, meta={"sync": True})
        if v is not None:
            o["arrays"][name] = v
        del pm

    def halo_meta(self, hid, call, key, extra=None):
        s = self.shalo[hid]
        pm = self.pats[s["pid"]]
        d = 0 if call.startswith("update") else 1
        # who needs whose part: a rank needs the ranks it receives from in direction d
        deps = {r: {q for q in range(P) if r in pm.readers[d][q]} for r in range(P)}
        if call.endswith("_begin"):  # a begin publishes and needs nobody's part
            deps = {r: set() for r in range(P)}
        m = {"sync": True, "deps": deps, "halo": hid}
        if call.endswith("_end"):
            m["since"] = s["pending"]["key"] if s["pending"] else key
        if extra:
            m.update(extra)
        return m

    def fill_all(self, s, pm, key, tag=0):
        """Every rank's array for call ``key`` as (size, block) of the Halo's dtype."""
        return [data(self.seed, key, r, (pm.size[r], s["block"]), s["dtype"], tag) for r in range(P)]

    def expected(self, s, pm, call, xs, rop):
        if call.startswith("update"):
            return pm.forward(R, xs)
        return pm.reverse(R, xs, rop)

    def get_array(self, o, name, fresh_shape=None):
        """The named array of a Halo on this rank; None for a vector whose vector() raised here
        (after an error: the call is then skipped on this rank)."""
        if name == "f":
            a = np.empty(o["shape"], o["arrays"]["k0"].dtype)
            o["arrays"]["f"] = a
            return a
        return o["arrays"].get(name)

    def do_hop(self, st, key=None, order_meta=None):
        key = key or (st["i"], 0)
        hid, call = st["hid"], st["call"]
        s = self.shalo[hid]
        pm = self.pats[s["pid"]]
        o = self.ohalo.get(hid)
        meta = self.halo_meta(hid, call, key, order_meta)
        if call.endswith("_end"):
            pend = s["pending"]
            s["pending"] = None
            if o is None or pend["x"] is None:
                return self.call(key, self.skip, meta=meta)
            x = pend["x"]
            before = pend["before"]
            want = self.expected(s, pm, call, pend["xs"], pend.get("rop"))

            def check(_, cls):
                return self.check_halo(x, before, want, cls)

            self.call(key, lambda: getattr(o["h"], call)(x), check, meta=meta, p=[("Halo", call)])
            return
        xs = self.fill_all(s, pm, key)
        x = self.get_array(o, st["arr"]) if o is not None else None
        if x is None:
            if call.endswith("_begin"):
                s["pending"] = {
                    "call": call,
                    "key": key,
                    "xs": xs,
                    "rop": st.get("rop"),
                    "x": None,
                    "before": None,
                }
            return self.call(key, self.skip, meta=meta)
        x.reshape(pm.size[R], s["block"])[...] = xs[R]
        before = x.copy()
        rop = st.get("rop")
        if call.endswith("_begin"):
            s["pending"] = {"call": call, "key": key, "xs": xs, "rop": rop, "x": x, "before": before}
            fn = (
                (lambda: o["h"].update_begin(x))
                if call == "update_begin"
                else (lambda: o["h"].reverse_begin(x, rop))
            )

            def check(_, cls):
                return self.check_untouched(x, before, "begin")

            self.call(key, fn, check, meta=meta, p=[("Halo", call)])
            return
        want = self.expected(s, pm, call, xs, rop)
        fn = (lambda: o["h"].update(x)) if call == "update" else (lambda: o["h"].reverse(x, rop))

        def check(_, cls):
            return self.check_halo(x, before, want, cls)

        self.call(key, fn, check, meta=meta, p=[("Halo", call)])

    def check_halo(self, x, before, want, cls):
        if want.size == 0:
            return None
        got = x.reshape(want.shape)
        if cls is None:
            return None if same_bits(got, want) else diff(got, want)
        b = before.reshape(want.shape)
        gb = got.reshape(len(got), -1).view(np.uint8)
        ok = (gb == b.reshape(len(b), -1).view(np.uint8)).all(1) | (
            gb == want.reshape(len(want), -1).view(np.uint8)
        ).all(1)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            return (
                f"after the error entry [{i}] is {got[i].tolist()}: neither the old {b[i].tolist()} "
                f"nor the new {want[i].tolist()}"
            )
        return None

    def check_untouched(self, x, before, what):
        if not same_bits(x, before):
            return f"{what} changed the array: " + diff(
                x.reshape(len(before), -1), before.reshape(len(before), -1)
            )
        return None

    def do_group(self, st):
        acts = st["acts"]
        order = st["orders"][R]
        # metas for every action first, in program order (the same on every rank)
        for j in order:
            a = acts[j]
            self.do_hop(a, key=(st["i"], j))

    def do_free_halo(self, st):
        hid = st["id"]
        key = (st["i"], 0)
        if hid in self.dead:
            o = self.graveyard.get(hid)
            return self.call(key, (o["h"].free if o else self.skip), meta={"sync": False, "free": True})
        self.dead.add(hid)
        self.shalo.pop(hid, None)
        o = self.ohalo.pop(hid, None)
        if o is None:
            return self.call(key, self.skip, meta={"sync": False, "free": True})
        # keep a private array and the object for use-after-free probes; shared vectors stay
        # as stale arrays (written through after every step)
        self.graveyard[hid] = {"h": o["h"], "x": o["arrays"]["k0"]}
        self.keep_stale([a for n, a in o["arrays"].items() if n.startswith("v")])
        self.call(key, o["h"].free, meta={"sync": False, "free": True})

    # ------------------------------------------------------------ global memory

    def mem_layout(self, m, r):
        """(count, slot offset of (origin q, parity p), static offset of buffer e, atomic words)."""
        W = m["W"]
        slots = P * 2 * W
        static = slots
        atomics = static + 2 * W
        n_atomic = (2 * P + 2) if m["dtype"] == "int64" else 0
        return atomics + n_atomic + m["pad"][r], atomics

    def do_mem(self, st):
        mid = st["mid"]
        dt = np.dtype(st["dtype"])
        m = {"dtype": st["dtype"], "W": st["W"], "pad": st["pad"], "epoch": 0, "puts": {}, "adds": {}}
        m["counts"] = [self.mem_layout(m, r)[0] for r in range(P)]
        m["atom"] = self.mem_layout(m, 0)[1]
        m["parts"] = [np.zeros(c, dt) for c in m["counts"]]
        self.smem[mid] = m
        key = (st["i"], 0)

        def check(mem, cls):
            if cls:
                return None
            # (its part was zeroed, but a faster peer may already have put into it)
            if tuple(mem.counts) != tuple(m["counts"]) or mem.local.size != m["counts"][R]:
                return f"GlobalMemory counts {mem.counts}, local size {mem.local.size}"
            return None

        cls, mem = self.call(
            key,
            lambda: hybridmpi.GlobalMemory(self.hc, m["counts"][R], dt),
            check,
            vcat="onesided",
            meta={"sync": True},
        )
        if mem is not None:
            self.omem[mid] = mem

    def slot(self, m, q, p):
        return (2 * q + p) * m["W"]

    def static_off(self, m, e):
        return P * 2 * m["W"] + (e % 2) * m["W"]

    def sync_lists(self, targets):
        lists = []
        for r in range(P):
            s = set()
            t = targets[r]
            if t is not None and t != r:
                s.add(t)
            s |= {q for q in range(P) if targets[q] == r and q != r}
            lists.append(sorted(s))
        return lists

    def do_put(self, st):
        mid = st["mid"]
        m = self.smem[mid]
        mem = self.omem.get(mid)
        ops = st["ops"]
        dt = np.dtype(m["dtype"])
        key = (st["i"], 0)
        wrote = []  # (origin q, target t, parity)
        for q, o in enumerate(ops):
            if o is None:
                continue
            n = m["puts"].get((q, o["t"]), 0)
            m["puts"][(q, o["t"])] = n + 1
            par = n % 2
            vals = data(self.seed, key, q, (o["b"] - o["a"],), dt)
            off = self.slot(m, q, par) + o["a"]
            m["parts"][o["t"]][off : off + vals.size] = vals
            wrote.append((q, o["t"], par))
        o = ops[R]
        req = None
        if o is not None:
            par = (m["puts"][(R, o["t"])] - 1) % 2
            vals = data(self.seed, key, R, (o["b"] - o["a"],), dt)
            off = self.slot(m, R, par) + o["a"]
            how = o["how"]
            if how == "Put2d" and vals.size % 2 == 0 and vals.size:
                vals = vals.reshape(-1, 2)
                how = "Put"
            elif how == "Put2d":
                how = "Put"

            def fn():
                nonlocal req
                if mem is None:
                    self.skip()
                if how == "Put":
                    mem.Put(vals, o["t"], off)
                else:
                    req = mem.Rput(vals, o["t"], off)
                    if how == "Rput-wait":
                        req.wait()
                    elif how == "Rput-waitall":
                        hybridmpi.waitall([req])

            self.call(
                key,
                fn,
                vcat="onesided",
                meta={"sync": False, "local": True},
                p=[("GlobalMemory", "Put" if how == "Put" else "Rput")],
            )
        else:
            self.nocall(key, {"sync": False, "local": True})
        self.sync_and_check(
            st, mid, m, mem, [None if x is None else x["t"] for x in ops], wrote, (st["i"], 1)
        )

    def sync_and_check(self, st, mid, m, mem, targets, wrote, key):
        """The round's synchronization, then this rank's slots written in it, against the model."""
        lists = self.sync_lists(targets)
        mine = [(q, par) for q, t, par in wrote if t == R]

        def check(_, cls):
            if cls or mem is None:
                return None
            for q, par in mine:
                a = self.slot(m, q, par)
                got = mem.local[a : a + m["W"]]
                want = m["parts"][R][a : a + m["W"]]
                if not same_bits(got, want):
                    return f"slot of origin {q} (parity {par}) after sync: " + diff(got, want)
            return None

        if st["sync"] == "all":
            meta = {"sync": True, "deps": None}
            fn = (lambda: mem.sync_all()) if mem is not None else self.skip
            pk = [("GlobalMemory", "sync_all"), ("HybridComm", "barrier")]
        else:
            meta = {"sync": True, "images": True, "deps": {r: set(lists[r]) for r in range(P)}}
            fn = (lambda: mem.sync_images(lists[R])) if mem is not None else self.skip
            pk = [("GlobalMemory", "sync_images")]
        self.call(key, fn, check, vcat="onesided", meta=meta, p=pk)

    def do_get(self, st):
        mid = st["mid"]
        m = self.smem[mid]
        mem = self.omem.get(mid)
        o = st["ops"][R]
        key = (st["i"], 0)
        dt = np.dtype(m["dtype"])
        off = self.static_off(m, m["epoch"]) + o["a"]
        want = m["parts"][o["t"]][off : off + o["b"] - o["a"]].copy()
        out = np.full(want.shape, 77, dt)
        deferred = []

        def fn():
            if mem is None:
                self.skip()
            how = o["how"]
            if how == "Get":
                mem.Get(out, o["t"], off)
            else:
                req = mem.Rget(out, o["t"], off)
                if how == "Rget":
                    req.wait()
                elif how == "Rget-test":
                    t_end = time.monotonic() + 5
                    while not req.test():
                        if time.monotonic() > t_end:
                            raise RuntimeError("Request.test() never became true")
                    req.wait()
                else:
                    deferred.append(req)

        def check(_, cls):
            if cls or deferred:
                return None
            return None if same_bits(out, want) else "Get: " + diff(out, want)

        self.call(
            key,
            fn,
            check,
            vcat="onesided",
            meta={"sync": False, "local": True},
            p=[("GlobalMemory", "Get" if o["how"] == "Get" else "Rget")],
        )
        if st.get("qid"):
            self.oreq[st["qid"]] = [(deferred[0] if deferred else None, out, want, key)]

    def do_wait_reqs(self, st):
        key = (st["i"], 0)
        items = []
        for q in st["qids"]:
            items += self.oreq.pop(q, [])
        reqs = [it[0] for it in items if it[0] is not None]

        def fn():
            if st["how"] == "waitall":
                hybridmpi.waitall(reqs)
            else:
                for r in reqs:
                    r.wait()

        def check(_, cls):
            if cls:
                return None
            for req, out, want, k in items:
                if req is not None and not same_bits(out, want):
                    return f"Rget of step {k[0]} after wait: " + diff(out, want)
            return None

        self.call(key, fn, check, vcat="onesided", meta={"sync": False, "local": True})

    def do_republish(self, st):
        """Each rank writes its own next static buffer, then sync_all: a new epoch for gets."""
        mid = st["mid"]
        m = self.smem[mid]
        mem = self.omem.get(mid)
        m["epoch"] += 1
        dt = np.dtype(m["dtype"])
        key = (st["i"], 0)
        for r in range(P):
            off = self.static_off(m, m["epoch"])
            m["parts"][r][off : off + m["W"]] = data(self.seed, key, r, (m["W"],), dt)
        if mem is not None:
            off = self.static_off(m, m["epoch"])
            mem.local[off : off + m["W"]] = m["parts"][R][off : off + m["W"]]
        self.call(
            key,
            (lambda: mem.sync_all()) if mem is not None else self.skip,
            vcat="onesided",
            meta={"sync": True, "deps": None},
            p=[("GlobalMemory", "sync_all"), ("HybridComm", "barrier")],
        )

    def do_atomic(self, st):
        mid = st["mid"]
        m = self.smem[mid]
        mem = self.omem.get(mid)
        key = (st["i"], 0)
        base = m["atom"]
        expect_old = None
        shared_before = {}
        shared_adds = {}
        written = []
        for q, o in enumerate(st["ops"]):
            if o is None:
                continue
            t = o["t"]
            if o["how"] == "fadd-shared":
                n = m["adds"].get(("s", t), 0)
                w = base + 2 * P + n % 2
                shared_before.setdefault(t, (w, int(m["parts"][t][w])))
                shared_adds.setdefault(t, []).append(o["v"])
                old = None
            else:
                n = m["adds"].get((q, t), 0)
                m["adds"][(q, t)] = n + 1
                w = base + 2 * q + n % 2
                old = int(m["parts"][t][w])
                if o["how"] == "fadd":
                    m["parts"][t][w] = old + o["v"]
                elif o["how"] == "cas-hit":
                    m["parts"][t][w] = o["v"]
                written.append((t, w))
            if q == R:
                expect_old = (o["how"], w, old)
        for t, vals in shared_adds.items():
            n = m["adds"].get(("s", t), 0)
            m["adds"][("s", t)] = n + 1
            w, before = shared_before[t]
            m["parts"][t][w] = before + sum(vals)
            written.append((t, w))
        o = st["ops"][R]
        if o is not None:
            how, w, old = expect_old

            def fn():
                if mem is None:
                    self.skip()
                if how in ("fadd", "fadd-shared"):
                    return mem.fetch_add(o["t"], w - 0, o["v"])
                if how == "cas-hit":
                    return mem.compare_swap(o["t"], w, old, o["v"])
                return mem.compare_swap(o["t"], w, old + 1, o["v"])

            def check(got, cls):
                if cls:
                    return None
                if how == "fadd-shared":
                    w0, before = shared_before[o["t"]]
                    vals = shared_adds[o["t"]]
                    lo = before + sum(v for v in vals if v < 0)
                    hi = before + sum(v for v in vals if v > 0)
                    return None if lo <= got <= hi else f"fetch_add returned {got}, outside [{lo}, {hi}]"
                return None if got == old else f"{how} returned {got}, the model's old value is {old}"

            self.call(
                key,
                fn,
                check,
                vcat="onesided",
                meta={"sync": False, "local": True},
                p=[("GlobalMemory", "fetch_add" if how.startswith("fadd") else "compare_swap")],
            )
        else:
            self.nocall(key, {"sync": False, "local": True})
        mine = [w for t, w in written if t == R]

        def check(_, cls):
            if cls or mem is None:
                return None
            for w in mine:
                if int(mem.local[w]) != int(m["parts"][R][w]):
                    return (
                        f"atomic word {w} is {int(mem.local[w])} after sync_all, "
                        f"model {int(m['parts'][R][w])}"
                    )
            return None

        self.call(
            (st["i"], 1),
            (lambda: mem.sync_all()) if mem is not None else self.skip,
            check,
            vcat="onesided",
            meta={"sync": True, "deps": None},
            p=[("GlobalMemory", "sync_all"), ("HybridComm", "barrier")],
        )

    def do_flush(self, st):
        mem = self.omem.get(st["mid"])
        key = (st["i"], 0)
        self.call(
            key,
            (lambda: mem.flush(st["rank"])) if mem is not None else self.skip,
            vcat="onesided",
            meta={"sync": False, "local": True},
            p=[("GlobalMemory", "flush")],
        )

    def do_free_mem(self, st):
        mid = st["id"]
        key = (st["i"], 0)
        self.dead.add(mid)
        self.smem.pop(mid, None)
        mem = self.omem.pop(mid, None)
        self.gm_graveyard[mid] = mem
        if mem is not None and not mem.closed:   # its part and a node peer's, kept past free
            self.keep_stale([mem.local] + [mem.local_view(r) for r in range(P) if r != R][:1])
        self.call(key, mem.free if mem is not None else self.skip, meta={"sync": False, "free": True})

    # ------------------------------------------------------------ coarrays

    def do_co(self, st):
        cid = st["cid"]
        shape = tuple(st["shape"])
        dt = np.dtype(st["dtype"])
        self.sco[cid] = {
            "shape": shape,
            "dtype": st["dtype"],
            "parts": [np.zeros(shape, dt) for _ in range(P)],
            "puts": {},
            "epoch": 0,
        }
        key = (st["i"], 0)
        cls, co = self.call(
            key, lambda: hybridmpi.Coarray(self.hc, shape, dt), vcat="onesided", meta={"sync": True}
        )
        if co is not None:
            self.oco[cid] = co

    @staticmethod
    def sec_index(sec):
        k = sec[0]
        if k == "all":
            return slice(None)
        if k == "int":
            return sec[1]
        if k == "ellipsis":
            return Ellipsis
        return slice(sec[1], sec[2], sec[3])

    def do_co_put(self, st):
        cid = st["cid"]
        c = self.sco[cid]
        co = self.oco.get(cid)
        dt = np.dtype(c["dtype"])
        key = (st["i"], 0)
        wrote = []
        mine = None
        for q, o in enumerate(st["ops"]):
            if o is None:
                continue
            n = c["puts"].get((q, o["t"]), 0)
            c["puts"][(q, o["t"])] = n + 1
            par = n % 2
            idx = (q, par, self.sec_index(o["sec"]))
            shape = c["parts"][o["t"]][idx].shape
            if o["how"] == "scalar":
                vals = data(self.seed, key, q, (), dt, small=True)[()]
            else:
                vals = data(self.seed, key, q, shape, dt, small=True)
            c["parts"][o["t"]][idx] = vals
            wrote.append((q, o["t"], par))
            if q == R:
                mine = (o, idx, vals)
        if mine is not None:
            o, idx, vals = mine

            def fn():
                if co is None:
                    self.skip()
                if o["how"] == "Rput":
                    co.Rput(o["t"], idx, vals).wait()
                else:
                    co[o["t"]][idx] = vals

            self.call(
                key,
                fn,
                vcat="onesided",
                meta={"sync": False, "local": True},
                p=[("Coarray", "put")] + ([("Coarray", "Rput")] if o["how"] == "Rput" else []),
            )
        else:
            self.nocall(key, {"sync": False, "local": True})
        targets = [None if o is None else o["t"] for o in st["ops"]]
        lists = self.sync_lists(targets)
        here = [(q, par) for q, t, par in wrote if t == R]

        def check(_, cls):
            if cls or co is None:
                return None
            for q, par in here:
                got, want = co.local[q, par], c["parts"][R][q, par]
                if not same_bits(got, want):
                    return f"coarray row ({q}, {par}) after sync: " + diff(got, want)
            return None

        if st["sync"] == "all":
            meta, fn = {"sync": True, "deps": None}, (lambda: co.sync_all()) if co is not None else self.skip
            pk = [("Coarray", "sync_all"), ("HybridComm", "barrier")]
        else:
            meta = {"sync": True, "images": True, "deps": {r: set(lists[r]) for r in range(P)}}
            fn = (lambda: co.sync_images(lists[R])) if co is not None else self.skip
            pk = [("Coarray", "sync_images")]
        self.call((st["i"], 1), fn, check, vcat="onesided", meta=meta, p=pk)

    def do_co_republish(self, st):
        """Each rank writes its next static row (row P, by epoch parity), then sync_all."""
        cid = st["cid"]
        c = self.sco[cid]
        co = self.oco.get(cid)
        c["epoch"] += 1
        key = (st["i"], 0)
        row = (P, c["epoch"] % 2)
        for r in range(P):
            c["parts"][r][row] = data(self.seed, key, r, c["shape"][2:], np.dtype(c["dtype"]), small=True)
        if co is not None:
            co.local[row] = c["parts"][R][row]
        self.call(
            key,
            (lambda: co.sync_all()) if co is not None else self.skip,
            vcat="onesided",
            meta={"sync": True, "deps": None},
            p=[("Coarray", "sync_all"), ("HybridComm", "barrier")],
        )

    def do_co_get(self, st):
        """Gets of the static rows (row P, by epoch parity), which only their owner writes."""
        cid = st["cid"]
        c = self.sco[cid]
        co = self.oco.get(cid)
        o = st["ops"][R]
        key = (st["i"], 0)
        idx = (P, c["epoch"] % 2, self.sec_index(o["sec"]))
        want = np.array(c["parts"][o["t"]][idx])
        holder = {}

        def fn():
            if co is None:
                self.skip()
            if o["how"] == "Rget":
                out = np.empty(want.shape, np.dtype(c["dtype"]))
                co.Rget(o["t"], idx, out).wait()
                holder["got"] = out
            else:
                holder["got"] = co[o["t"]][idx]

        def check(_, cls):
            if cls:
                return None
            got = np.asarray(holder["got"])
            return None if same_bits(got, want) else "coarray get: " + diff(got.reshape(-1), want.reshape(-1))

        self.call(
            key,
            fn,
            check,
            vcat="onesided",
            meta={"sync": False, "local": True},
            p=[("Coarray", "Rget" if o["how"] == "Rget" else "get")],
        )

    def do_free_co(self, st):
        cid = st["id"]
        key = (st["i"], 0)
        self.sco.pop(cid, None)
        co = self.oco.pop(cid, None)
        if co is not None and not co.closed:
            self.keep_stale([co.local, co.local[..., ::2]])
        self.call(key, co.free if co is not None else self.skip, meta={"sync": False, "free": True})

    # ------------------------------------------------------------ collectives

    def reduce(self, vals, op):
        acc = np.array(vals[0])
        for v in vals[1:]:
            acc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op](acc, v)
        return acc

    def do_barrier(self, st):
        key = (st["i"], 0)
        fn = (
            (lambda: self.hc.barrier())
            if st["method"] is None
            else (lambda: self.hc.barrier(method=st["method"]))
        )
        self.call(key, fn, meta={"sync": True, "deps": None}, p=[("HybridComm", "barrier")])

    def do_allreduce(self, st):
        key = (st["i"], 0)
        dt = np.dtype(st["dtype"])
        vals = [self.prep(st, key, r) for r in range(P)]
        want = self.reduce(vals, st["red"])
        scalar = st["n"] == 0
        mine = vals[R][()] if scalar else vals[R]
        if scalar and int(key[0]) % 2:  # a Python number half of the time
            mine = mine.item()

        def check(got, cls):
            if cls:
                return None
            g = np.asarray(got)
            if scalar:
                if not np.isscalar(got) and np.ndim(got) != 0:
                    return f"allreduce of a scalar returned {type(got).__name__}"
                return None if g.astype(dt) == want.astype(dt) else f"allreduce {got!r}, want {want!r}"
            return (
                None if same_bits(g.astype(dt), want.astype(dt)) else "allreduce: " + diff(g, want.astype(dt))
            )

        self.call(
            key,
            lambda: self.hc.allreduce(mine, op=st["red"]),
            check,
            vcat="coll",
            meta={"sync": True, "deps": None},
            p=[("HybridComm", "allreduce")],
        )

    def prep(self, st, key, r):
        dt = np.dtype(st["dtype"])
        if st["n"] == 0:
            v = data(self.seed, key, r, (), dt, small=True)
        else:
            v = data(self.seed, key, r, (st["n"],), dt, small=True)
        if st["red"] == "prod":  # 1 or 2: products stay exact whatever the order
            v = ((v.real if dt.kind == "c" else v) % 2 + 1).astype(dt)
        return v

    def do_Allreduce(self, st):
        key = (st["i"], 0)
        dt = np.dtype(st["dtype"])
        vals = [self.prep(st, key, r) for r in range(P)]
        want = self.reduce(vals, st["red"]).astype(dt)
        send = vals[R].copy()
        recv = np.full(st["n"], 5, dt)
        op = (
            {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}[st["red"]]
            if st["mpiop"]
            else st["red"]
        )

        def fn():
            if st["inplace"]:
                self.hc.Allreduce(MPI.IN_PLACE, send, op=op)
            else:
                self.hc.Allreduce(send, recv, op=op)

        def check(_, cls):
            if cls:
                return None
            got = send if st["inplace"] else recv
            return None if same_bits(got, want) else "Allreduce: " + diff(got, want)

        self.call(
            key, fn, check, vcat="coll", meta={"sync": True, "deps": None}, p=[("HybridComm", "Allreduce")]
        )

    # ------------------------------------------------------------ profile

    def do_prof_start(self, st):
        key = (st["i"], 0)
        self.prof_on = True
        self.pcount = {}
        prof = hybridmpi.profile(self.hc)
        cls, _ = self.call(key, prof.__enter__, meta={"sync": True, "deps": None})
        self.prof = prof if cls is None else None

    def do_prof_stop(self, st):
        key = (st["i"], 0)
        self.prof_on = False
        prof = self.prof
        self.prof = None
        counts = self.pcount
        self.pcount = {}

        def fn():
            if prof is None:
                self.skip()
            prof.__exit__(None, None, None)
            rows = prof.rows()
            buf = io.StringIO()
            prof.print(file=buf)
            with tempfile.TemporaryDirectory() as d:
                prof.to_json(os.path.join(d, "p.json"))
            return rows

        def check(rows, cls):
            if cls or rows is None:
                return None
            got = {}
            for row in rows:
                obj = row["object"].split(" ")[0]
                got[(obj, row["op"])] = got.get((obj, row["op"]), 0) + row["calls"]
            for k in sorted(set(counts) | set(got)):
                if got.get(k, 0) != counts.get(k, 0):
                    return (
                        f"profile counted {got.get(k, 0)} calls of {k}, this rank made {counts.get(k, 0)} "
                        f"(all rows: {sorted(got.items())}; calls made: {sorted(counts.items())})"
                    )
            return None

        self.call(key, fn, check, vcat="profile", meta={"sync": True, "deps": None})

    # ============================================================ misuse
