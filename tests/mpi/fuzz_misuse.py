"""The fuzzer's misuse steps: wrong calls on every rank or on one rank (tests/mpi/fuzz.py)."""

import json
import time

import numpy as np
from fuzz_common import (
    DTYPES,
    METHODS,
    SHORT_TIMEOUT,
    OwnError,
    P,
    PatModel,
    R,
    comm,
    diff,
    same_bits,
    unsendable,
)
from mpi4py import MPI

import hybridmpi


class Misuse:
    """The misuse steps of a Program (a mixin of fuzz.Program)."""

    def misuse_meta(self, st, extra=None):
        m = {"misuse": True, "mode": st["mode"], "bad": st["bad"], "mk": st["mk"], "exp": st["exp"]}
        if extra:
            m.update(extra)
        return m

    def i_am_bad(self, st):
        return st["bad"] == "all" or st["bad"] == R

    def do_misuse_hop(self, st):
        a = st["act"]
        hid, call = a["hid"], a["call"]
        s = self.shalo[hid]
        pm = self.pats[s["pid"]]
        o = self.ohalo.get(hid)
        key = (st["i"], 0)
        d = 0 if call.startswith("update") else 1
        meta = self.halo_meta(hid, call, key, self.misuse_meta(st))
        bad = st["bad"]
        if st["mode"] == "one" and not call.endswith("_begin"):
            # its readers must raise; the bad rank's own HybridComm breaks when a good peer sends
            # to it (the guide: the Halo stays usable when every rank's arguments were invalid)
            meta["must"] = sorted(pm.readers[d][bad])
            meta["taints"] = True
        if st["mk"] == "halo-vector-mismatch":
            meta["may_succeed"] = True
        xs = self.fill_all(s, pm, key)
        x = self.get_array(o, a["arr"]) if o is not None else None
        if x is None:
            return self.call(key, self.skip, meta=meta)
        x.reshape(pm.size[R], s["block"])[...] = xs[R]
        before = x.copy()
        rop = a.get("rop")
        want = self.expected(s, pm, call, xs, rop)
        h = o["h"]
        if self.i_am_bad(st):
            arg, rop2, restore = self.bad_halo_arg(st, x, o, s)
        else:
            arg, rop2, restore = x, rop, None
        fnname = call
        if call.endswith("_begin") and st["mode"] == "one" and not self.i_am_bad(st):
            # the good ranks' begin stays pending until the end action below
            pass

        def fn():
            try:
                if fnname in ("update", "update_begin"):
                    getattr(h, fnname)(arg)
                else:
                    getattr(h, fnname)(arg, rop2)
            finally:
                if restore:
                    restore()

        def check(_, cls):
            if call.endswith("_begin"):
                return self.check_untouched(x, before, "a begin")
            if self.i_am_bad(st) and st["mk"] == "halo-vector-mismatch":
                v1 = arg
                if cls is None:
                    return self.check_untouched(x, before, "a call on the other vector") or self.check_halo(
                        v1, before, want, None
                    )
                return self.check_halo(v1, before, want, cls)
            if self.i_am_bad(st) and cls:
                return self.check_untouched(x, before, "an invalid call")
            return self.check_halo(x, before, want, cls)

        vcat = "untouched" if self.i_am_bad(st) else "partial"
        pk = [("Halo", call)]  # counted only when it returns
        cls, _ = self.call(key, fn, check, vcat=vcat, meta=meta, p=pk)
        if call.endswith("_begin") and st["mode"] == "one":
            # the good ranks end it; the bad rank made no pending call
            end = st["end"]
            ekey = (st["i"], 1)
            emeta = self.halo_meta(hid, end["call"], ekey)
            emeta.update(
                {
                    "since": key,
                    "ref": list(key),
                    "refbad": bad,
                    "refmk": st["mk"],
                    "refmust": sorted(pm.readers[d][bad]),
                }
            )
            if R == bad and cls is not None:
                return self.nocall(ekey, emeta)
            # (the bad rank ends too when its begin returned: another vector is no error where
            # the method moves vectors as arrays)
            y = arg if R == bad else x
            want = self.expected(s, pm, end["call"], xs, rop)

            def echeck(_, cls):
                return self.check_halo(y, before, want, cls)

            self.call(
                ekey,
                lambda: getattr(h, end["call"])(y),
                echeck,
                vcat="partial",
                meta=emeta,
                p=[("Halo", end["call"])],
            )

    def bad_halo_arg(self, st, x, o, s):
        """This rank's invalid argument for misuse kind st['mk']: (array, op, restore)."""
        mk = st["mk"]
        a = st["act"]
        rop = a.get("rop")
        rng = np.random.default_rng([st["param"], R])
        dt = x.dtype
        if mk == "halo-nonarray":
            return x.tolist(), rop, None
        if mk == "halo-dtype":
            other = [d for d in DTYPES if np.dtype(d) != dt]
            nd = np.dtype(other[int(rng.integers(0, len(other)))])
            if nd.itemsize == dt.itemsize and rng.random() < 0.5:
                return x.view(nd), rop, None
            return x.astype(nd), rop, None
        if mk == "halo-shape":  # shapes that are none of (n,), (n, 1) [block 1], (n, b), (n * b,)
            n, b = o["shape"][0], s["block"]
            shapes = (
                ([(n + 1,), (n + 2, 1), (n, 2)] + ([(n - 1,)] if n else []))
                if b == 1
                else [(n, b + 1), (n * b + 1,), (n + 1, b), (n, b, 1)]
            )
            shape = shapes[int(rng.integers(0, len(shapes)))]
            y = np.zeros(shape, dt)
            k = min(y.size, x.size)
            y.reshape(-1)[:k] = x.reshape(-1)[:k]
            return y, rop, None
        if mk == "halo-noncontig":
            wide = (
                np.zeros((x.shape[0], 2) + x.shape[1:], dt)
                if x.ndim == 1
                else np.zeros((x.shape[0], 2 * x.shape[1]), dt)
            )
            v = wide[:, 0] if x.ndim == 1 else wide[:, ::2]
            v[...] = x
            return v, rop, None
        if mk == "halo-readonly":
            x.flags.writeable = False

            def restore():
                x.flags.writeable = True

            return x, rop, restore
        if mk == "halo-op":
            ops = [None, "mul", 3, "ADD", "sum", ""]
            if "op-none" in self.cfg.avoid:
                ops = ops[1:]
            return x, ops[int(rng.integers(0, len(ops)))], None
        if mk == "halo-cminmax":
            return x, ["min", "max"][int(rng.integers(0, 2))], None
        if mk == "halo-vector-mismatch":  # the same values, in the other vector
            v1 = o["arrays"]["v1"]
            v1[...] = x
            return v1, rop, None
        raise AssertionError(mk)

    def do_misuse_state(self, st):
        hid = st["hid"]
        s = self.shalo[hid]
        o = self.ohalo.get(hid)
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": False})
        if not self.i_am_bad(st):
            return self.nocall(key, meta)
        if o is None:
            return self.call(key, self.skip, meta=meta)
        pend = s["pending"]
        arr = st["arr"]
        if arr == "f":
            x = np.empty(o["shape"], o["arrays"]["k0"].dtype)
        else:
            x = o["arrays"].get(arr, o["arrays"]["k0"])
        if st["mk"] == "halo-end-other-array" and pend is not None and x is pend["x"]:
            x = x.copy()
        before = x.copy()
        h = o["h"]
        call = st["call"]

        def fn():
            if call in ("reverse", "reverse_begin"):
                getattr(h, call)(x, st.get("rop") or "add")
            else:
                getattr(h, call)(x)

        def check(_, cls):
            return self.check_untouched(x, before, "an invalid call") if cls else None

        self.call(key, fn, check, vcat="untouched", meta=meta)

    def do_misuse_freed(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": False})
        if not self.i_am_bad(st):
            return self.nocall(key, meta)
        g = self.graveyard.get(st["hid"])
        if g is None:
            return self.call(key, self.skip, meta=meta)
        h, x = g["h"], g["x"]
        call = st["call"]
        fn = {
            "update": lambda: h.update(x),
            "reverse": lambda: h.reverse(x),
            "update_begin": lambda: h.update_begin(x),
            "vector": lambda: h.vector(),
        }[call]
        self.call(key, fn, meta=meta)

    def do_misuse_ctor(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None, "agreed": True})
        meta["must"] = list(range(P))
        pat = self.opat.get(st["pid"])
        kw = {"dtype": np.dtype(st["dtype"]), "block": st["block"], "method": st["method"]}
        if self.i_am_bad(st):
            w, v = st["what"], st["val"]
            if w == "diff":
                if v == "dtype":
                    kw["dtype"] = np.dtype("float32" if st["dtype"] != "float32" else "float64")
                elif v == "block":
                    kw["block"] = st["block"] + 1
                else:
                    kw["method"] = next(x for x in METHODS if x != st["method"])
            elif w == "dtype":
                kw["dtype"] = v
            else:
                kw[w] = v
        cls, h = self.call(
            key, (lambda: hybridmpi.Halo(pat, **kw)) if pat is not None else self.skip, meta=meta
        )
        if h is not None:  # it must not exist; free it so that nothing leaks (collective on those ranks)
            self.stray.append(h)

    def do_misuse_pattern(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None, "agreed": True})
        meta["must"] = list(range(P))
        spec = json.loads(json.dumps(st["spec"]))
        pm = PatModel(spec, P)
        if self.i_am_bad(st):
            owned, ghosts = spec["owned"][R], spec["ghosts"][R]
            how = st["how"]
            if how == "nobody":
                everything = [g for o in spec["owned"] for g in o]
                ghosts.append((max(everything) if everything else 0) + 12345)
            elif how == "dup":
                others = [g for q in range(P) if q != R for g in spec["owned"][q]]
                ghosts.append(ghosts[0] if ghosts else others[0])
                if not spec["ghosts"][R][:-1] and others:
                    ghosts.append(others[0])
            elif how == "own":
                ghosts.append(owned[0])
            if spec["kind"] == "explicit" and how in ("nobody", "dup", "own", "range"):
                send, recv = pm.explicit_lists(R)
                size = pm.size[R]
                if how == "range":
                    send = dict(send)
                    q = next((q for q in range(P) if q != R), None)
                    recv = dict(recv)
                    recv[q] = np.concatenate((recv.get(q, np.zeros(0, np.int64)), [size + 3]))
                elif how == "own":
                    q = next(q for q in range(P) if q != R)
                    recv = dict(recv)
                    recv[R] = np.array([0])
                else:
                    q = next(q for q in range(P) if q != R)
                    recv = dict(recv)
                    recv[q] = np.concatenate((recv.get(q, np.zeros(0, np.int64)), [size]))

                def fn():
                    return hybridmpi.GhostPattern(self.hc, send=send, recv=recv, size=size)
            else:

                def fn():
                    return hybridmpi.GhostPattern.from_global(
                        self.hc, np.array(owned, np.int64), np.array(ghosts, np.int64)
                    )
        else:

            def fn():
                return self.make_pattern(pm, spec)

        self.call(key, fn, vcat="pattern", meta=meta)

    def do_misuse_gm(self, st):
        """A bad Put/Get/Rput/Rget/atomic/flush on the bad ranks; the others a valid Get."""
        mid = st["mid"]
        m = self.smem[mid]
        mem = self.omem.get(mid)
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": False, "local": True})
        dt = np.dtype(m["dtype"])
        t = st["t"]
        rng = np.random.default_rng([st["param"], R])
        off0 = self.static_off(m, m["epoch"])
        want = m["parts"][t][off0 : off0 + m["W"]].copy()
        if mem is None:
            return self.call(key, self.skip, meta=meta)
        if not self.i_am_bad(st):
            out = np.empty(m["W"], dt)

            def check(_, cls):
                return None if cls or same_bits(out, want) else "Get next to a bad call: " + diff(out, want)

            return self.call(
                key,
                lambda: mem.Get(out, t, off0),
                check,
                vcat="onesided",
                meta=meta,
                p=[("GlobalMemory", "Get")],
            )
        mk = st["mk"]
        how = st["how"]
        count = m["counts"][t]
        vals = np.arange(2, dtype=dt)
        rank, off = t, 0
        arr = vals
        get = how in ("Get", "Rget")
        if get:
            arr = np.empty(2, dt)
        if mk == "gm-rank":
            rank = [-1, P, P + 7, 2**63, 2**64 + 1, -(2**63), 1.0, True, np.int64(P), "0", None][
                int(rng.integers(0, 11))
            ]
        elif mk == "gm-offset":
            n = arr.size
            off = [
                -1,
                count - n + 1,
                count,
                2**31,
                2**62,
                2**63 - 1,
                2**63,
                2**64 - 1,
                2**64 + 5,
                -(2**63),
                np.int64(2**63 - 1),
                np.uint64(2**64 - 1),
                np.int64(-1),
                1.5,
                "3",
            ][int(rng.integers(0, 15))]
        elif mk == "gm-length":
            n = count + 1 + int(rng.integers(0, 3))
            arr = np.empty(n, dt) if get else np.ones(n, dt)
            off = int(rng.integers(0, 2))
        elif mk == "gm-dtype":
            other = [
                d
                for d in ("float64", "int64", "int32", "float32", "complex128", "uint8")
                if np.dtype(d) != dt
            ]
            arr = arr.astype(other[int(rng.integers(0, len(other)))])
        elif mk == "gm-nonarray":
            arr = [1, 2] if rng.random() < 0.5 else bytearray(16)
        elif mk == "gm-noncontig":
            wide = np.zeros(4, dt)
            arr = wide[::2]
        elif mk == "gm-readonly":
            arr = np.empty(2, dt)
            arr.flags.writeable = False
            how = "Get" if rng.random() < 0.5 else "Rget"
        elif mk == "gm-atomic":
            what = int(rng.integers(0, 5))
            if dt != np.int64:
                how = "fadd"
            elif what == 0:
                how, off = "fadd", [count, -1, 2**63 - 1, 2**63][int(rng.integers(0, 4))]
            elif what == 1:
                how, off = "fadd-value", m["atom"]
            elif what == 2:
                how, off = "cas-value", m["atom"]
            elif what == 3:
                how, rank = "fadd", [P, -1][int(rng.integers(0, 2))]
            else:
                how, off = "cas", count + 2
        elif mk == "gm-flush":
            how = "flush"
            rank = [P, -1, 1.5, "x"][int(rng.integers(0, 4))]

        def fn():
            if how == "Put":
                mem.Put(arr, rank, off)
            elif how == "Get":
                mem.Get(arr, rank, off)
            elif how == "Rput":
                mem.Rput(arr, rank, off).wait()
            elif how == "Rget":
                mem.Rget(arr, rank, off).wait()
            elif how == "fadd":
                mem.fetch_add(rank, off, 1)
            elif how == "fadd-value":
                mem.fetch_add(rank, off, [2**63, -(2**63) - 1, 1.5][int(rng.integers(0, 3))])
            elif how == "cas-value":
                mem.compare_swap(rank, off, 2**64, 1)
            elif how == "cas":
                mem.compare_swap(rank, off, 0, 1)
            elif how == "flush":
                mem.flush(rank)

        self.call(key, fn, meta=meta)

    def do_misuse_req(self, st):
        mid = st["mid"]
        m = self.smem[mid]
        mem = self.omem.get(mid)
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": False, "local": True})
        if not self.i_am_bad(st):
            return self.nocall(key, meta)
        if mem is None:
            return self.call(key, self.skip, meta=meta)
        dt = np.dtype(m["dtype"])
        off = self.static_off(m, m["epoch"])
        out = np.empty(1, dt)

        def fn():
            if st["how"] == "Rget":
                req = mem.Rget(out, st["t"], off)
            else:  # into this rank's own static buffer, the value it already holds
                out[0] = m["parts"][R][off]
                req = mem.Rput(out, R, off)
            if self.prof is not None:  # the profile records the Rput/Rget, not the waits
                k = ("GlobalMemory", st["how"])
                self.pcount[k] = self.pcount.get(k, 0) + 1
            req.wait()
            if st["twice"] == "wait":
                req.wait()
            else:
                hybridmpi.waitall([req])

        self.call(key, fn, meta=meta)

    def do_misuse_gmfreed(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": False, "local": True})
        if not self.i_am_bad(st):
            return self.nocall(key, meta)
        mem = self.gm_graveyard.get(st["mid"])
        if mem is None:
            return self.call(key, self.skip, meta=meta)
        how = st["how"]
        fn = {
            "Put": lambda: mem.Put(np.zeros(1, mem.dtype), R, 0),
            "Get": lambda: mem.Get(np.zeros(1, mem.dtype), R, 0),
            "sync_all": lambda: mem.sync_all(),
            "fetch_add": lambda: mem.fetch_add(R, 0, 1),
            "local_view": lambda: mem.local_view(R),
        }[how]
        self.call(key, fn, meta=meta)

    def do_misuse_gmctor(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None, "agreed": True})
        meta["must"] = list(range(P))
        count, dtype = 4, np.float64
        if self.i_am_bad(st):
            if st["what"] == "count":
                count = st["val"]
            elif st["what"] == "dtype":
                dtype = {"object": object, "U2": "U2", "nonsense": "nonsense"}[st["val"]]
            else:
                dtype = np.float32
        cls, mem = self.call(key, lambda: hybridmpi.GlobalMemory(self.hc, count, dtype), meta=meta)
        if mem is not None:
            self.stray.append(mem)

    def do_misuse_sync(self, st):
        mid = st["mid"]
        mem = self.omem.get(mid)
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True})
        bad = st["bad"]
        peer = (R + 1) % P
        if st["mode"] == "one":
            # the others name the bad rank, as a right program would
            meta["deps"] = {r: ({bad} if r != bad else set()) for r in range(P)}
            meta["must"] = [r for r in range(P) if r != bad]
            good = [bad] if R != bad else []
            # the counts stay matched: the comm stays usable, the namers raise PeerArgumentError
            meta["agreed"] = True
            meta["peer_cls"] = "PeerArgumentError"
        else:
            good = []
        if mem is None:
            return self.call(key, self.skip, meta=meta)
        if self.i_am_bad(st):
            arg = {"range": [P], "dup": [peer, peer], "type": "ab", "neg": [-1]}[st["how"]]
            if st["how"] == "dup" and P == 1:
                arg = [P]
        else:
            arg = good
        self.call(key, lambda: mem.sync_images(arg), meta=meta)

    def do_misuse_co(self, st):
        cid = st["cid"]
        c = self.sco[cid]
        co = self.oco.get(cid)
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": False, "local": True})
        t = st["t"]
        idx_ok = (P, c["epoch"] % 2, slice(None))
        want = np.array(c["parts"][t][idx_ok])
        if co is None:
            return self.call(key, self.skip, meta=meta)
        if not self.i_am_bad(st):
            holder = {}

            def check(_, cls):
                return (
                    None
                    if cls or same_bits(holder["got"], want)
                    else "coarray get next to a bad call: " + diff(holder["got"], want)
                )

            def fn():
                holder["got"] = co[t][idx_ok]

            return self.call(key, fn, check, vcat="onesided", meta=meta, p=[("Coarray", "get")])
        how = st["how"]
        shape = c["shape"]

        def fn():
            if how == "oob":
                return co[t][shape[0], 0, 0]
            if how == "advanced":
                return co[t][[0, 1]]
            if how == "shape":
                co[t][R, 0, :] = np.ones(shape[2] + 1)
            elif how == "rank":
                return co[P][0, 0, 0]
            elif how == "step0":
                return co[t][0, 0, ::0]
            elif how == "float":
                return co[t][0.5]
            else:
                co.Rget(t, (P, 0), np.empty(shape[2] + 2, co.dtype)).wait()

        self.call(key, fn, meta=meta)

    def do_misuse_coll(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None})
        if st["mode"] == "one":
            meta["must"] = list(range(P))
            meta["taints"] = True
        mk = st["mk"]
        rng = np.random.default_rng([st["param"], 0])
        dt = np.dtype(st["dtype"])
        n = st["n"]
        good = np.ones(n, dt) * (R + 1)
        if mk == "barrier-method":
            method = "tree"
            if self.i_am_bad(st):
                method = ["butterfly", None, 3, "Tree"][int(rng.integers(0, 4))]
                if method is None:
                    method = "linear"  # another valid method on this rank
                    if st["bad"] == "all":
                        method = "butterfly"
            return self.call(key, lambda: self.hc.barrier(method=method), meta=meta)
        if mk == "coll-Allreduce":
            send, recv = good.copy(), np.empty(n, dt)
            if self.i_am_bad(st):
                k = int(rng.integers(0, 3))
                if k == 0:
                    recv.flags.writeable = False
                elif k == 1:
                    recv = np.empty(n + 1, dt)
                else:
                    recv = recv.astype(np.float32 if dt != np.float32 else np.float64)
            return self.call(key, lambda: self.hc.Allreduce(send, recv, op=MPI.SUM), meta=meta)
        x, op = good, "sum"
        if self.i_am_bad(st):
            if mk == "coll-type":
                x = ["1.0", [1.0, 2.0], None, np.zeros(n, np.int8), {"a": 1}][int(rng.integers(0, 5))]
            elif mk == "coll-op":
                k = int(rng.integers(0, 3))
                if k == 0:
                    op = "avg"
                elif k == 1:
                    op = None
                else:
                    x, op = np.ones(n, np.complex128), "min"
                    if st["bad"] != "all":
                        x, op = good, "avg"
            elif mk == "coll-len":
                x = np.ones(n + 1, dt)

        def check(got, cls):
            if cls:
                return None
            return None

        self.call(key, lambda: self.hc.allreduce(x, op=op), check, meta=meta)

    def do_misuse_nbo(self, st):
        acts = st["acts"]
        for j in st["orders"][R]:
            a = acts[j]
            key = (st["i"], j)
            extra = {"misuse": True, "mode": "nbo", "bad": "all", "mk": st["mk"], "exp": st["exp"]}
            self.do_hop(a, key=key, order_meta=extra)

    def do_misuse_prof(self, st):
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None})
        meta["must"] = list(range(P))
        # its agreement travels on the comm's own communicator: no allreduce is recorded
        self.call(key, lambda: hybridmpi.profile(self.hc).__enter__(), meta=meta)

    def do_misuse_with(self, st):
        """Rank ``bad`` raises its own OwnError inside a with block; the others make a call."""
        key = (st["i"], 0)
        bad, call = st["bad"], st["call"]
        kind, oid = st["obj"]
        meta = self.misuse_meta(st, {"sync": True, "withraise": True})
        if call == "update":
            hm = self.halo_meta(st["hid"], "update", key)
            deps = hm["deps"]
        elif call == "none":
            deps = {r: set() for r in range(P)}
        else:
            deps = {r: set(range(P)) - {r} for r in range(P)}
        meta["deps"] = deps
        meta["must"] = [r for r in range(P) if r != bad and bad in deps[r]]
        if R == bad:
            if kind == "prof":
                prof = self.prof
                self.prof = None
                obj = None
            else:
                obj = {
                    "hc": lambda: self.hc,
                    "halo": lambda: (self.ohalo.get(oid) or {}).get("h"),
                    "mem": lambda: self.omem.get(oid),
                    "co": lambda: self.oco.get(oid),
                }[kind]()
            delay = st["delay_ms"] * 1e-3

            def fn():
                if kind == "prof":
                    if prof is None:
                        self.skip()
                    time.sleep(delay)
                    try:
                        raise OwnError(f"rank {R}'s own error inside a profile block")
                    except OwnError as e:
                        prof.__exit__(OwnError, e, e.__traceback__)
                        raise
                if obj is None:
                    self.skip()
                with obj:
                    time.sleep(delay)
                    raise OwnError(f"rank {R}'s own error inside a {kind} block")

            return self.call(key, fn, meta=meta)
        if call == "none":
            return self.nocall(key, meta)
        if call == "barrier":
            return self.call(key, lambda: self.hc.barrier(), meta=meta, p=[("HybridComm", "barrier")])
        if call == "allreduce":

            def check(got, cls):
                return None if cls or got == float(P) else f"allreduce(1.0) returned {got!r}, want {float(P)}"

            return self.call(
                key,
                lambda: self.hc.allreduce(1.0),
                check,
                vcat="coll",
                meta=meta,
                p=[("HybridComm", "allreduce")],
            )
        if call == "sync_all":
            mem = self.omem.get(st["mid"])
            return self.call(
                key,
                (lambda: mem.sync_all()) if mem is not None else self.skip,
                meta=meta,
                p=[("GlobalMemory", "sync_all"), ("HybridComm", "barrier")],
            )
        hid = st["hid"]
        s = self.shalo[hid]
        pm = self.pats[s["pid"]]
        o = self.ohalo.get(hid)
        xs = self.fill_all(s, pm, key)
        if o is None:
            return self.call(key, self.skip, meta=meta)
        x = self.get_array(o, st["arr"])
        x.reshape(pm.size[R], s["block"])[...] = xs[R]
        before = x.copy()
        want = pm.forward(R, xs)

        def hcheck(_, cls):
            return self.check_halo(x, before, want, cls)

        self.call(key, lambda: o["h"].update(x), hcheck, vcat="partial", meta=meta, p=[("Halo", "update")])

    def do_probe_broken(self, st):
        """After a rank's own exception broke the comm: a barrier and an allreduce raise on
        every rank."""
        meta = {"sync": True, "deps": None, "probe": True}
        self.call((st["i"], 0), lambda: self.hc.barrier(), meta=dict(meta))
        self.call((st["i"], 1), lambda: self.hc.allreduce(1.0), meta=dict(meta))

    def do_misuse_deadline(self, st):
        """On a side HybridComm (timeout SHORT_TIMEOUT): ranks st['ctor'] make an object, the
        others call barrier/allreduce/update; then the side comm is broken and freed."""
        i = st["i"]
        ctor = set(st["ctor"])
        comm.Barrier()  # no drift into the side comm's short deadline (not a library call)
        _, side = self.call(
            (i, 0),
            lambda: hybridmpi.HybridComm(comm, node_size=self.cfg.node_size, timeout=SHORT_TIMEOUT),
            meta={"sync": True},
            pause=False,
        )
        n = 4
        ghost_of = (R + 1) % P

        def ring():
            return hybridmpi.GhostPattern.from_global(
                side, np.arange(R * n, R * n + n), np.array([ghost_of * n], np.int64)
            )

        _, pat = self.call((i, 1), ring if side is not None else self.skip, meta={"sync": True}, pause=False)
        _, h = self.call(
            (i, 2),
            (lambda: hybridmpi.Halo(pat, method=st["method"])) if pat is not None else self.skip,
            meta={"sync": True},
            pause=False,
        )
        deps = {r: ({(r + 1) % P} if st["call"] == "update" else set(range(P)) - {r}) for r in range(P)}
        must = [r for r in range(P) if r in ctor or deps[r] & ctor]
        meta = self.misuse_meta(
            st, {"sync": True, "deadline": True, "ctor": sorted(ctor), "call": st["call"], "must": must}
        )
        x = np.concatenate((np.arange(R * n, R * n + n, dtype=np.float64), [-1.0]))
        want = x.copy()
        want[n] = ghost_of * n
        before = x.copy()
        if R in ctor:
            make = st["make"]
            fn = {
                "Halo": lambda: hybridmpi.Halo(pat),
                "GlobalMemory": lambda: hybridmpi.GlobalMemory(side, 4),
                "Coarray": lambda: hybridmpi.Coarray(side, (2, 3)),
                "from_global": ring,
                "profile": lambda: hybridmpi.profile(side).__enter__(),
            }[make]
            check = None
        else:
            fn = {
                "barrier": lambda: side.barrier(),
                "allreduce": lambda: side.allreduce(1.0),
                "update": lambda: h.update(x),
            }[st["call"]]

            def check(_, cls):
                return self.check_halo(x, before, want, cls) if st["call"] == "update" else None

        if h is None:
            fn = self.skip
        self.call((i, 3), fn, check, meta=meta, pause=False)
        self.call(
            (i, 4),
            (lambda: side.barrier()) if side is not None else self.skip,
            meta={"sync": True, "deps": None, "probe": True, "side": True},
            pause=False,
        )
        self.call(
            (i, 5),
            side.free if side is not None else self.skip,
            meta={"sync": False, "lenient": True},
            pause=False,
        )

    def do_misuse_unsend(self, st):
        """A constructor argument that cannot travel (pickled or shown) on the bad ranks."""
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None, "agreed": True})
        meta["must"] = list(range(P))
        what = st["what"]
        bad = self.i_am_bad(st)
        v = unsendable(st["val"]) if bad else None
        if what.startswith("halo"):
            pat = self.opat.get(st["pid"])
            kw = {"dtype": np.float64, "block": 1, "method": st["method"]}
            if bad:
                kw[what[5:]] = v

            def fn():
                if pat is None:
                    self.skip()
                return hybridmpi.Halo(pat, **kw)
        elif what == "gm-dtype":

            def fn():
                return hybridmpi.GlobalMemory(self.hc, 4, v if bad else np.float64)
        elif what == "gm-count":

            def fn():
                return hybridmpi.GlobalMemory(self.hc, v if bad else 4, np.float64)
        elif what == "co-dtype":

            def fn():
                return hybridmpi.Coarray(self.hc, (2, 3), v if bad else np.float64)
        else:  # co-shape: a generator as the shape, or a bad extent in it
            shape = (2, 3)
            if bad:
                shape = v if st["val"] == "gen" else (2, v)

            def fn():
                return hybridmpi.Coarray(self.hc, shape, np.float64)

        cls, obj = self.call(key, fn, meta=meta)
        if obj is not None:
            self.stray.append(obj)

    def do_misuse_freeorder(self, st):
        """Each rank frees one of two objects first: RuntimeError on every rank, nothing freed."""
        key = (st["i"], 0)
        meta = self.misuse_meta(st, {"sync": True, "deps": None, "agreed": True})
        meta["must"] = list(range(P))
        meta["free"] = True
        kind, oid = st["objs"][st["which"][R]]
        obj = (self.ohalo.get(oid) or {}).get("h") if kind == "halo" else self.omem.get(oid)
        self.call(key, obj.free if obj is not None else self.skip, meta=meta)
        if obj is not None and obj.closed:   # a broken comm's free is local: gone on this rank
            if kind == "halo":
                o = self.ohalo.pop(oid)
                self.graveyard[oid] = {"h": o["h"], "x": o["arrays"]["k0"]}
            else:
                self.gm_graveyard[oid] = self.omem.pop(oid)

    def do_pyint(self, st):
        """allreduce of Python ints: the exact Python result, as a Python int."""
        key = (st["i"], 0)
        vals, red = st["vals"], st["red"]
        want = vals[0]
        for v in vals[1:]:
            want = {"sum": lambda a, b: a + b, "prod": lambda a, b: a * b, "min": min, "max": max}[red](
                want, v
            )

        def check(got, cls):
            if cls:
                return None
            if type(got) is not int or got != want:
                return (
                    f"allreduce({vals[R]}, {red!r}) of {vals} returned {got!r} "
                    f"({type(got).__name__}), want {want}"
                )
            return None

        self.call(
            key,
            lambda: self.hc.allreduce(vals[R], op=red),
            check,
            vcat="coll",
            meta={"sync": True, "deps": None},
            p=[("HybridComm", "allreduce")],
        )

    def cleanup(self):
        """After a failure: free what is left (the watchdog ends the job if that hangs)."""
        try:
            if self.hc is not None and not self.hc.closed:
                self.hc.free()
        except Exception:  # noqa: BLE001 - the failure was reported already
            pass
