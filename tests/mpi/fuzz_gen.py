"""The fuzzer's generator: one program's steps, the same on every rank (tests/mpi/fuzz.py)."""

import numpy as np
from fuzz_common import (
    BREAKS,
    DTYPES,
    MISUSE,
    PYINTS,
    ROPS,
    SLOW,
    TAINTING,
    PatModel,
    _i,
    pattern_spec,
)


class Gen:
    """Draws one program (a list of JSON-able steps) from a seed; the same on every rank."""

    def __init__(self, seed, nranks, cfg):
        self.rng = np.random.default_rng([seed, 1])
        self.P = nranks
        self.cfg = cfg
        self.steps = []
        self.pats = {}  # pid -> PatModel
        self.halos = {}  # hid -> dict(pid, dtype, block, method, nvec, pending)
        self.dead_halos = []
        self.mems = {}  # mid -> dict(kind, dtype, counts)
        self.dead_mems = []
        self.cos = {}  # cid -> shape
        self.reqs = []  # deferred Rgets: (qid, mid)
        self.prof = False
        self.n = 0
        self.one_used = False
        self.end_at = None

    def new_id(self, prefix):
        self.n += 1
        return f"{prefix}{self.n}"

    def add(self, step):
        step["i"] = len(self.steps)
        self.steps.append(step)

    def choice(self, seq):
        seq = list(seq)
        return seq[int(self.rng.integers(0, len(seq)))]

    # ------------------------------------------------------------ program

    def program(self, n_steps):
        self.start_hc()
        while len(self.steps) < n_steps:
            if self.end_at is not None and len(self.steps) >= self.end_at:
                # the comm may be broken: free everything; go on with a new HybridComm
                if not self.cfg.restart or n_steps - len(self.steps) < 15:
                    break
                self.finish()
                self.start_hc(restart=True)
                continue
            self.gen_step()
        self.finish()
        return self.steps

    def start_hc(self, restart=False):
        rng = self.rng
        step = {
            "op": "hc",
            "memory_order": self.choice(["acq_rel"] * 4 + ["seq_cst"]),
            "allreduce": self.choice(["recursive_doubling", "recursive_doubling", "tree"]),
            "radix": self.choice([2, 3, 4, 4]),
            "env": self.choice(["default", "zc0", "cma0", "both0", "both0"]),
            "check_every": self.cfg.check_every or self.choice([1, 2, 5, 10, 25, 50]),
        }
        if restart:  # a new HybridComm after the last one was freed (broken or not)
            step["restart"] = True
            self.pats = {}
            self.dead_halos, self.dead_mems, self.reqs = [], [], []
            self.prof = False
            self.one_used = False
            self.end_at = None
        self.add(step)
        self.gen_pattern()
        for _ in range(_i(rng.integers(1, 4))):
            self.gen_halo()
        self.gen_mem()

    def gen_step(self):
        rng = self.rng
        live = [h for h, s in self.halos.items()]
        w = {
            "hop": 30,
            "group": 10,
            "pending": 6,
            "halo": 4,
            "pattern": 1.5,
            "vector": 2,
            "free_halo": 2.5,
            "coll": 8,
            "put": 8,
            "get": 5,
            "atomic": 4,
            "co": 5,
            "republish": 2,
            "mem": 1,
            "free_mem": 1,
            "prof": 1.5,
            "wait_reqs": 2,
            "flush": 1,
            "pyint": 2,
            "misuse": 12 if self.cfg.misuse else 0,
        }
        if not live:
            w["hop"] = w["group"] = w["pending"] = w["vector"] = w["free_halo"] = 0
            w["halo"] = 20
        if not self.mems:
            w["put"] = w["get"] = w["atomic"] = w["republish"] = w["free_mem"] = 0
            w["mem"] = 5
        names = list(w)
        p = np.array([w[k] for k in names], float)
        kind = names[int(rng.choice(len(names), p=p / p.sum()))]
        getattr(self, "gen_" + kind)()

    def finish(self):
        """End every pending call, wait, stop the profile, free everything in a random order."""
        for hid, s in list(self.halos.items()):
            if s["pending"]:
                self.add_end(hid)
        if self.reqs:
            self.gen_wait_reqs()
        if self.prof:
            self.add({"op": "prof_stop"})
            self.prof = False
        objs = (
            [("free_halo", h) for h in self.halos]
            + [("free_mem", m) for m in self.mems]
            + [("free_co", c) for c in self.cos]
        )
        for k in self.rng.permutation(len(objs)):
            op, oid = objs[int(k)]
            self.add({"op": op, "id": oid})
        self.halos, self.mems, self.cos = {}, {}, {}
        self.add({"op": "hc_free"})
        self.add({"op": "after_free"})

    # ------------------------------------------------------------ ghost updates

    def gen_pattern(self):
        pid = self.new_id("p")
        spec = pattern_spec(self.rng, self.P)
        self.pats[pid] = PatModel(spec, self.P)
        self.add({"op": "pattern", "pid": pid, "spec": spec})

    def gen_halo(self):
        if len(self.halos) >= 8:
            return self.gen_free_halo()
        if not self.pats or self.rng.random() < 0.1:
            self.gen_pattern()
        hid = self.new_id("h")
        pid = self.choice(self.pats)
        s = {
            "pid": pid,
            "dtype": self.choice(DTYPES),
            "block": self.choice([1, 1, 2, 3]),
            "method": self.choice(self.cfg.methods),
            "nvec": 0,
            "pending": None,
        }
        self.halos[hid] = s
        self.add(
            {
                "op": "halo",
                "hid": hid,
                "pid": pid,
                "dtype": s["dtype"],
                "block": s["block"],
                "method": s["method"],
            }
        )

    def gen_vector(self):
        hid = self.choice(self.halos)
        s = self.halos[hid]
        if s["nvec"] >= 2 or (s["pending"] and "vector-pending" in self.cfg.avoid):
            return self.gen_hop()
        s["nvec"] += 1
        self.add({"op": "vector", "hid": hid})

    def arr_name(self, s):
        vec = {0: [], 1: ["v0", "v0"], 2: ["v0", "v0", "v1"]}[s["nvec"]]
        return self.choice(["k0", "k0", "k1", "ka", "f"] + vec)

    def rop(self, s):
        ops = ROPS if s["dtype"] != "complex128" else ("add", "insert")
        return self.choice(ops)

    def hop_action(self, hid, call):
        s = self.halos[hid]
        a = {"op": "hop", "hid": hid, "call": call, "arr": self.arr_name(s)}
        if call.startswith("reverse"):
            a["rop"] = self.rop(s)
        return a

    def idle_halos(self):
        return [h for h, s in self.halos.items() if not s["pending"]]

    def gen_hop(self):
        idle = self.idle_halos()
        if not idle:
            return self.gen_pending()
        hid = self.choice(idle)
        call = self.choice(["update", "update", "reverse", "split_update", "split_reverse"])
        if call.startswith("split"):
            d = call[6:]
            b = self.hop_action(hid, d + "_begin")
            self.add(b)
            self.add({"op": "hop", "hid": hid, "call": d + "_end", "arr": b["arr"]})
        else:
            self.add(self.hop_action(hid, call))

    def gen_pending(self):
        """Begin a call that stays pending over the next steps, or end one."""
        pend = [h for h, s in self.halos.items() if s["pending"]]
        idle = self.idle_halos()
        if pend and (not idle or self.rng.random() < 0.5):
            return self.add_end(self.choice(pend))
        if idle:
            hid = self.choice(idle)
            a = self.hop_action(hid, self.choice(["update_begin", "reverse_begin"]))
            self.halos[hid]["pending"] = a
            self.add(a)

    def add_end(self, hid):
        b = self.halos[hid]["pending"]
        self.halos[hid]["pending"] = None
        self.add({"op": "hop", "hid": hid, "call": b["call"].replace("begin", "end"), "arr": b["arr"]})

    def gen_group(self):
        """Several Halos' calls, begun and ended in a different order on each rank."""
        idle = self.idle_halos()
        if len(idle) < 2:
            return self.gen_hop()
        k = _i(self.rng.integers(2, min(4, len(idle)) + 1))
        chosen = [idle[int(j)] for j in self.rng.permutation(len(idle))[:k]]
        acts = []
        for hid in chosen:
            call = self.choice(["split_update", "split_reverse", "split_update", "update", "reverse"])
            if call.startswith("split"):
                d = call[6:]
                b = self.hop_action(hid, d + "_begin")
                acts.append(b)
                acts.append({"op": "hop", "hid": hid, "call": d + "_end", "arr": b["arr"]})
            else:
                acts.append(self.hop_action(hid, call))
        orders = self.orders(acts)
        self.add({"op": "group", "acts": acts, "orders": orders})

    def orders(self, acts):
        """Per rank, an order of ``acts`` that the guide allows and that cannot deadlock if
        begins never wait for peers and an end waits for every peer's begin (actions of
        methods in --same-order are in one global order and wait for every rank; the end of an
        ``atomic`` call on a shared vector waits for every peer's end: zero copy's owner waits
        for its readers' DONE)."""
        n = len(acts)
        same = set(self.cfg.same_order)
        pred = [set() for _ in range(n)]
        for j, a in enumerate(acts):
            if a["call"].endswith("_end"):
                pred[j].add(next(i for i in range(j) if acts[i]["hid"] == a["hid"]))
        chains = {}
        for j, a in enumerate(acts):
            s = self.halos[a["hid"]]
            if s["method"] in same:
                chains.setdefault("same", []).append(j)
            elif s["method"] == "neighbor" and not a["call"].endswith("_end"):
                chains.setdefault("nb-" + s["pid"], []).append(j)
        for chain in chains.values():
            for x, y in zip(chain, chain[1:]):
                pred[y].add(x)
        collective = [self.halos[a["hid"]]["method"] in same
                      or (self.halos[a["hid"]]["method"] == "atomic" and a["call"].endswith("_end")
                          and a["arr"] in ("v0", "v1"))
                      for a in acts]
        if "order" in self.cfg.avoid:
            return [self.topo(pred)] * self.P
        for _ in range(30):
            orders = [self.topo(pred) for _ in range(self.P)]
            if self.deadlock_free(acts, orders, collective):
                return orders
        return [list(range(n))] * self.P

    def topo(self, pred):
        done, order = set(), []
        while len(order) < len(pred):
            ready = [j for j in range(len(pred)) if j not in done and pred[j] <= done]
            j = self.choice(ready)
            done.add(j)
            order.append(j)
        return order

    def deadlock_free(self, acts, orders, collective):
        pos = [0] * self.P
        began = {}
        arrived = {}
        moved = True
        while moved:
            moved = False
            for r in range(self.P):
                while pos[r] < len(acts):
                    j = orders[r][pos[r]]
                    a = acts[j]
                    if collective[j]:
                        arrived.setdefault(j, set()).add(r)
                        if not a["call"].endswith("_end"):
                            began.setdefault(a["hid"], set()).add(r)
                        if len(arrived[j]) < self.P:
                            break
                    elif a["call"].endswith("_begin"):
                        began.setdefault(a["hid"], set()).add(r)
                    else:
                        if not a["call"].endswith("_end"):
                            began.setdefault(a["hid"], set()).add(r)
                        if len(began.get(a["hid"], ())) < self.P:
                            break
                    pos[r] += 1
                    moved = True
        return all(p == len(acts) for p in pos)

    def pending_first(self):
        """With --avoid free-pending: end a pending call before anything is freed."""
        pend = [h for h, s in self.halos.items() if s["pending"]]
        if pend and "free-pending" in self.cfg.avoid:
            self.add_end(self.choice(pend))
            return True
        return False

    def gen_free_halo(self):
        if self.pending_first():
            return
        idle = self.idle_halos()
        if not idle:
            return self.gen_pending()
        hid = self.choice(idle)
        del self.halos[hid]
        self.dead_halos.append(hid)
        self.add({"op": "free_halo", "id": hid})
        if self.rng.random() < 0.2:
            self.add({"op": "free_halo", "id": hid})  # free() is idempotent

    # ------------------------------------------------------------ global memory

    def gen_mem(self):
        if len(self.mems) >= 3:
            return self.gen_free_mem()
        mid = self.new_id("m")
        dtype = self.choice(
            ["float64", "float64", "int64", "int64", "int32", "complex128", "float32", "uint8", "int16"]
        )
        W = self.choice([1, 2, 4, 7])
        pad = [_i(self.rng.integers(0, 4)) for _ in range(self.P)]
        self.mems[mid] = {"dtype": dtype, "W": W, "pad": pad, "epoch": 0}
        self.add({"op": "mem", "mid": mid, "dtype": dtype, "W": W, "pad": pad})
        if self.rng.random() < 0.4 and len(self.cos) < 2:
            cid = self.new_id("c")
            shape = [self.P + 1, 2, self.choice([1, 3, 6])]
            self.cos[cid] = {"shape": shape, "dtype": self.choice(["float64", "int32", "complex128"])}
            self.add({"op": "co", "cid": cid, "shape": shape, "dtype": self.cos[cid]["dtype"]})

    def gen_free_mem(self):
        if self.pending_first():
            return
        if self.reqs:
            return self.gen_wait_reqs()
        if self.cos and self.rng.random() < 0.4:
            cid = self.choice(self.cos)
            del self.cos[cid]
            return self.add({"op": "free_co", "id": cid})
        if not self.mems:
            return self.gen_mem()
        mid = self.choice(self.mems)
        del self.mems[mid]
        self.dead_mems.append(mid)
        self.add({"op": "free_mem", "id": mid})

    def targets(self):
        """Per rank: its target (or None: no put this round), drawn for a one-sided round."""
        t = []
        for _ in range(self.P):
            if self.rng.random() < 0.2:
                t.append(None)
            else:
                t.append(_i(self.rng.integers(0, self.P)))
        return t

    def sync_kind(self):
        return self.choice(["all", "images", "images"])

    def gen_put(self):
        if self.cos and self.rng.random() < 0.3:
            return self.gen_co()
        mid = self.choice(self.mems)
        m = self.mems[mid]
        ops = []
        for t in self.targets():
            if t is None:
                ops.append(None)
                continue
            a = _i(self.rng.integers(0, m["W"] + 1))
            b = _i(self.rng.integers(a, m["W"] + 1))
            ops.append(
                {
                    "t": t,
                    "a": a,
                    "b": b,
                    "how": self.choice(["Put", "Put", "Rput", "Rput-wait", "Rput-waitall", "Put2d"]),
                }
            )
        self.add({"op": "put", "mid": mid, "ops": ops, "sync": self.sync_kind()})

    def gen_get(self):
        if self.reqs and self.rng.random() < 0.3:
            return self.gen_wait_reqs()
        mid = self.choice(self.mems)
        m = self.mems[mid]
        ops = []
        for _ in range(self.P):
            t = _i(self.rng.integers(0, self.P))
            a = _i(self.rng.integers(0, m["W"] + 1))
            b = _i(self.rng.integers(a, m["W"] + 1))
            ops.append(
                {
                    "t": t,
                    "a": a,
                    "b": b,
                    "how": self.choice(["Get", "Get", "Rget", "Rget-test", "Rget-defer"]),
                }
            )
        step = {"op": "get", "mid": mid, "ops": ops}
        if any(o["how"] == "Rget-defer" for o in ops):
            qid = self.new_id("q")
            step["qid"] = qid
            self.reqs.append((qid, mid))
        self.add(step)

    def gen_wait_reqs(self):
        if not self.reqs:
            return
        self.add(
            {"op": "wait_reqs", "qids": [q for q, _ in self.reqs], "how": self.choice(["each", "waitall"])}
        )
        self.reqs = []

    def gen_republish(self):
        if self.reqs:
            return self.gen_wait_reqs()
        if self.cos and self.rng.random() < 0.4:
            return self.add({"op": "co_republish", "cid": self.choice(self.cos)})
        mid = self.choice(self.mems)
        self.add({"op": "republish", "mid": mid})

    def gen_atomic(self):
        ints = [m for m, s in self.mems.items() if s["dtype"] == "int64"]
        if not ints:
            return self.gen_put()
        mid = self.choice(ints)
        ops = []
        for t in self.targets():
            if t is None:
                ops.append(None)
                continue
            ops.append(
                {
                    "t": t,
                    "how": self.choice(["fadd", "fadd", "cas-hit", "cas-miss", "fadd-shared"]),
                    "v": _i(self.rng.integers(-50, 50)),
                }
            )
        self.add({"op": "atomic", "mid": mid, "ops": ops})

    def section(self, W):
        """A random basic index of the last axis of width W."""
        kind = self.choice(["all", "slice", "slice", "int", "ellipsis"])
        if kind == "all":
            return ["all"]
        if kind == "int":
            return ["int", _i(self.rng.integers(-W, W))]
        if kind == "ellipsis":
            return ["ellipsis"]
        step = self.choice([1, 1, 2, 3, -1, -2])
        a = _i(self.rng.integers(-W - 1, W + 2))
        b = _i(self.rng.integers(-W - 1, W + 2))
        return ["slice", a, b, step]

    def gen_co(self):
        if not self.cos:
            return self.gen_mem()
        cid = self.choice(self.cos)
        c = self.cos[cid]
        W = c["shape"][2]
        if self.rng.random() < 0.35:
            ops = [
                {
                    "t": _i(self.rng.integers(0, self.P)),
                    "sec": self.section(W),
                    "how": self.choice(["get", "get", "Rget"]),
                }
                for _ in range(self.P)
            ]
            return self.add({"op": "co_get", "cid": cid, "ops": ops})
        ops = []
        for t in self.targets():
            if t is None:
                ops.append(None)
                continue
            ops.append({"t": t, "sec": self.section(W), "how": self.choice(["set", "set", "scalar", "Rput"])})
        self.add({"op": "co_put", "cid": cid, "ops": ops, "sync": self.sync_kind()})

    def gen_flush(self):
        if not self.mems:
            return self.gen_mem()
        mid = self.choice(self.mems)
        self.add({"op": "flush", "mid": mid, "rank": self.choice([None, _i(self.rng.integers(0, self.P))])})

    # ------------------------------------------------------------ collectives, profile

    def gen_coll(self):
        kind = self.choice(["barrier", "allreduce", "allreduce", "Allreduce"])
        step = {"op": kind}
        if kind == "barrier":
            step["method"] = self.choice(["dissemination", "tree", "linear", None])
        else:
            dtype = self.choice(DTYPES)
            ops = ("sum", "prod", "min", "max") if dtype != "complex128" else ("sum", "prod")
            step.update(
                dtype=dtype,
                red=self.choice(ops),
                n=self.choice(
                    [0, 1, 1, 3, 12, 13, 100, 1000] + ([33000] if self.rng.random() < 0.05 else [])
                ),
            )
            if kind == "Allreduce":
                step["inplace"] = bool(self.rng.random() < 0.3)
                step["mpiop"] = bool(self.rng.random() < 0.5)
                if step["n"] == 0:
                    step["n"] = 1
        self.add(step)

    def gen_prof(self):
        if self.prof:
            self.prof = False
            self.add({"op": "prof_stop"})
        else:
            self.prof = True
            self.add({"op": "prof_start"})

    # ------------------------------------------------------------ misuse

    def gen_misuse(self):
        kinds = [k for k in MISUSE if k in self.cfg.kinds]
        if not kinds:
            return self.gen_hop()
        name = self.choice(kinds)
        if name in SLOW and self.rng.random() >= self.cfg.slow_misuse:
            return self.gen_hop()
        cat, modes, classes = MISUSE[name]
        modes = [m for m in modes if (m != "one" or not self.one_used) and (name, m) not in self.cfg.no_modes]
        if not modes:
            return self.gen_hop()
        mode = self.choice(modes)
        bad = "all" if mode == "all" else _i(self.rng.integers(0, self.P))
        step = getattr(self, "mis_" + cat)(name, mode, bad)
        if step is None:
            return self.gen_hop()
        step.update(mk=name, mode=mode, bad=bad)
        step.setdefault("exp", list(classes))
        if mode == "one":
            self.one_used = True
            if cat in TAINTING:
                self.end_at = len(self.steps) + 1 + _i(self.rng.integers(0, 9))
        self.add(step)
        if cat in BREAKS:
            # every later call raises on every rank: a probe, then the end (or a new comm)
            self.add({"op": "probe_broken"})
            self.end_at = len(self.steps)
        post = getattr(self, "post_" + cat, None)
        if post is not None:
            post(step)

    def mis_hop(self, name, mode, bad):
        cands = self.idle_halos()
        if name == "halo-cminmax":
            cands = [h for h in cands if self.halos[h]["dtype"] == "complex128"]
        if name == "halo-vector-mismatch":
            cands = [h for h in cands if self.halos[h]["nvec"] == 2]
        if not cands:
            return None
        hid = self.choice(cands)
        s = self.halos[hid]
        pm = self.pats[s["pid"]]
        if name == "halo-noncontig":  # a strided view of <= 1 point is contiguous
            ranks = range(self.P) if bad == "all" else [bad]
            if any(pm.size[r] * (s["block"] if True else 1) < 2 for r in ranks):
                return None
        if name in ("halo-op", "halo-cminmax"):
            call = self.choice(["reverse", "reverse_begin"])
        elif name == "halo-vector-mismatch":
            call = self.choice(["update", "reverse", "update_begin"])
        else:
            call = self.choice(["update", "reverse", "update_begin", "reverse_begin"])
        a = self.hop_action(hid, call)
        if name == "halo-vector-mismatch":
            a["arr"] = "v0"
        step = {"op": "misuse_hop", "act": a, "param": _i(self.rng.integers(0, 1 << 30))}
        if call.endswith("_begin") and mode == "one":
            step["end"] = {"op": "hop", "hid": hid, "call": call.replace("begin", "end"), "arr": a["arr"]}
        return step

    def mis_state(self, name, mode, bad):
        pend = [h for h, s in self.halos.items() if s["pending"]]
        idle = self.idle_halos()
        if name == "halo-end-without-begin":
            if not idle:
                return None
            hid = self.choice(idle)
            call = self.choice(["update_end", "reverse_end"])
            return {"op": "misuse_state", "hid": hid, "call": call, "arr": self.arr_name(self.halos[hid])}
        if not pend:
            return None
        hid = self.choice(pend)
        p = self.halos[hid]["pending"]
        if name == "halo-begin-twice":
            call = self.choice(["update_begin", "reverse_begin"])
            arr = p["arr"] if self.rng.random() < 0.5 else self.arr_name(self.halos[hid])
        elif name == "halo-end-other-array":
            call = p["call"].replace("begin", "end")
            others = [x for x in ("k0", "k1", "ka", "f") if x != p["arr"]]
            arr = self.choice(others)
        else:
            call = self.choice(["update", "reverse"])
            arr = self.arr_name(self.halos[hid])
        return {"op": "misuse_state", "hid": hid, "call": call, "arr": arr, "rop": self.rop(self.halos[hid])}

    def mis_freed(self, name, mode, bad):
        if not self.dead_halos:
            return None
        return {
            "op": "misuse_freed",
            "hid": self.choice(self.dead_halos),
            "call": self.choice(["update", "reverse", "update_begin", "vector"]),
        }

    def mis_ctor(self, name, mode, bad):
        if not self.pats:
            return None
        what = self.choice(
            ["dtype", "block", "method", "diff"] if mode == "one" else ["dtype", "block", "method"]
        )
        val = {
            "dtype": self.choice(["int8", "U3", "nonsense", "bool"]),
            "block": self.choice([0, -1, 1.5, True, "2"]),
            "method": self.choice(["carrier-pigeon", 3, "ATOMIC"]),
            "diff": self.choice(["dtype", "block", "method"]),
        }[what]
        exp = {
            "dtype": ["TypeError"],
            "block": ["ValueError"],
            "method": ["ValueError"],
            "diff": ["ValueError"],
        }[what]
        return {
            "op": "misuse_ctor",
            "pid": self.choice(self.pats),
            "what": what,
            "val": val,
            "dtype": self.choice(DTYPES),
            "block": self.choice([1, 2]),
            "method": self.choice(self.cfg.methods),
            "exp": exp,
        }

    def mis_pattern(self, name, mode, bad):
        spec = pattern_spec(self.rng, self.P)
        how = self.choice(
            ["nobody", "dup", "own", "range"] if spec["kind"] == "explicit" else ["nobody", "dup", "own"]
        )
        ranks = range(self.P) if bad == "all" else [bad]
        for r in ranks:  # a duplicate or an own id needs ids to repeat
            if (
                how == "dup"
                and not spec["ghosts"][r]
                and not any(spec["owned"][q] for q in range(self.P) if q != r)
            ):
                return None
            if how == "own" and not spec["owned"][r]:
                return None
        return {"op": "misuse_pattern", "spec": spec, "how": how}

    def mis_gm(self, name, mode, bad):
        mids = list(self.mems)
        if name == "gm-atomic" and self.rng.random() < 0.5:
            mids = [m for m in mids if self.mems[m]["dtype"] == "int64"] or mids
        if not mids:
            return None
        mid = self.choice(mids)
        return {
            "op": "misuse_gm",
            "mid": mid,
            "param": _i(self.rng.integers(0, 1 << 30)),
            "t": _i(self.rng.integers(0, self.P)),
            "how": self.choice(["Put", "Get", "Rput", "Rget"]),
        }

    def mis_req(self, name, mode, bad):
        if not self.mems:
            return None
        return {
            "op": "misuse_req",
            "mid": self.choice(self.mems),
            "t": _i(self.rng.integers(0, self.P)),
            "how": self.choice(["Rput", "Rget"]),
            "twice": self.choice(["wait", "waitall"]),
        }

    def mis_gmfreed(self, name, mode, bad):
        if not self.dead_mems:
            return None
        return {
            "op": "misuse_gmfreed",
            "mid": self.choice(self.dead_mems),
            "how": self.choice(["Put", "Get", "sync_all", "fetch_add", "local_view"]),
        }

    def mis_gmctor(self, name, mode, bad):
        what = self.choice(["count", "dtype", "diff"] if mode == "one" else ["count", "dtype"])
        val = {
            "count": self.choice([-1, 1.5, "4", True]),
            "dtype": self.choice(["object", "U2", "nonsense"]),
            "diff": "float32",
        }[what]
        exp = {"count": ["ValueError", "TypeError"], "dtype": ["TypeError"], "diff": ["ValueError"]}[what]
        return {"op": "misuse_gmctor", "what": what, "val": val, "exp": exp}

    def mis_sync(self, name, mode, bad):
        if not self.mems:
            return None
        return {
            "op": "misuse_sync",
            "mid": self.choice(self.mems),
            "how": self.choice(["range", "dup", "type", "neg"]),
        }

    def mis_co(self, name, mode, bad):
        if not self.cos:
            return None
        return {
            "op": "misuse_co",
            "cid": self.choice(self.cos),
            "t": _i(self.rng.integers(0, self.P)),
            "how": self.choice(["oob", "advanced", "shape", "rank", "step0", "float", "rget-out"]),
        }

    def mis_coll(self, name, mode, bad):
        step = {
            "op": "misuse_coll",
            "param": _i(self.rng.integers(0, 1 << 30)),
            "n": self.choice([1, 3, 13, 100]),
            "dtype": self.choice(["float64", "int64"]),
        }
        if name == "barrier-method":
            step["exp"] = ["ValueError"]
        return step

    def mis_nbo(self, name, mode, bad):
        """Two 'neighbor' Halos of one pattern begun in opposite orders on even and odd ranks
        (the guide: ValueError instead of mixed data), then ended."""
        by = {}
        for h in self.idle_halos():
            s = self.halos[h]
            if s["method"] == "neighbor":
                by.setdefault(s["pid"], []).append(h)
        pairs = [v for v in by.values() if len(v) >= 2]
        if not pairs or self.P < 2:
            return None
        h1, h2 = self.choice(pairs)[:2]
        acts = []
        for hid in (h1, h2):
            b = self.hop_action(hid, self.choice(["update_begin", "reverse_begin"]))
            acts += [b, {"op": "hop", "hid": hid, "call": b["call"].replace("begin", "end"), "arr": b["arr"]}]
        orders = [[0, 2, 1, 3] if r % 2 == 0 else [2, 0, 3, 1] for r in range(self.P)]
        return {"op": "misuse_nbo", "acts": acts, "orders": orders}

    def mis_withraise(self, name, mode, bad):
        """Rank ``bad`` leaves a with block of one object on its own exception while the
        others are in a call (or in none: they meet the broken comm in the probe)."""
        if self.P < 2:
            return None
        objs = (
            [["hc", None]]
            + [["halo", h] for h in self.halos]
            + [["mem", m] for m in self.mems]
            + [["co", c] for c in self.cos]
            + ([["prof", None]] if self.prof else [])
        )
        obj = self.choice(objs)
        calls = ["barrier", "allreduce", "none"]
        if self.mems:
            calls.append("sync_all")
        # fence and pscw wait inside MPI, where no failure is seen (the guide: baselines)
        upd = [h for h in self.idle_halos() if self.halos[h]["method"] not in ("fence", "pscw")]
        if upd:
            calls += ["update", "update"]
        call = self.choice(calls)
        step = {"op": "misuse_with", "obj": obj, "call": call, "delay_ms": _i(self.rng.integers(0, 60))}
        if call == "update":
            step["hid"] = self.choice(upd)
            step["arr"] = self.choice(["k0", "k1", "ka", "f"])
        elif call == "sync_all":
            step["mid"] = self.choice(self.mems)
        return step

    def mis_deadline(self, name, mode, bad):
        """Ranks in a constructor, the others in barrier/allreduce/update, on a side
        HybridComm with a short timeout."""
        if self.P < 2:
            return None
        ctor = {bad} | {r for r in range(self.P) if r != bad and self.rng.random() < 0.3}
        if len(ctor) == self.P:
            ctor.discard((bad + 1) % self.P)
        methods = [m for m in self.cfg.methods if m not in ("fence", "pscw")] or ["atomic"]
        return {
            "op": "misuse_deadline",
            "ctor": sorted(ctor),
            "make": self.choice(["Halo", "GlobalMemory", "Coarray", "from_global", "profile"]),
            "call": self.choice(["barrier", "allreduce", "update"]),
            "method": self.choice(methods),
        }

    def mis_unsend(self, name, mode, bad):
        whats = ["gm-dtype", "gm-count", "co-shape", "co-dtype"]
        if self.pats:
            whats += ["halo-dtype", "halo-block"]
        what = self.choice(whats)
        step = {
            "op": "misuse_unsend",
            "what": what,
            "val": self.choice(["gen", "lambda", "badrepr"]),
            "method": self.choice(self.cfg.methods),
        }
        if what.startswith("halo"):
            step["pid"] = self.choice(self.pats)
        return step

    def mis_freeorder(self, name, mode, bad):
        """Two objects, each rank frees one of them first (not all the same one)."""
        if "free-pending" in self.cfg.avoid and any(s["pending"] for s in self.halos.values()):
            return None
        # Halos with a window of their own (fence, pscw, lock) free it collectively, so their
        # order is checked; the others' free is local (any order, as the guide allows)
        cands = [["halo", h] for h in self.idle_halos()
                 if self.halos[h].get("method") in ("fence", "pscw", "lock")]
        if not self.reqs:
            cands += [["mem", m] for m in self.mems]
        if len(cands) < 2:
            return None
        k = self.rng.permutation(len(cands))[:2]
        objs = [cands[int(k[0])], cands[int(k[1])]]
        which = [_i(self.rng.integers(0, 2)) for _ in range(self.P)]
        if len(set(which)) == 1:
            j = _i(self.rng.integers(0, self.P))
            which[j] = 1 - which[j]
        return {"op": "misuse_freeorder", "objs": objs, "which": which}

    def post_freeorder(self, step):
        """Both objects stay usable: use each; then, half of the time, free them in one order."""
        for kind, oid in step["objs"]:
            if kind == "halo":
                self.add(self.hop_action(oid, self.choice(["update", "reverse"])))
            else:
                self.add({"op": "republish", "mid": oid})
        if self.rng.random() < 0.5:
            for kind, oid in step["objs"]:
                if kind == "halo":
                    del self.halos[oid]
                    self.dead_halos.append(oid)
                    self.add({"op": "free_halo", "id": oid})
                else:
                    del self.mems[oid]
                    self.dead_mems.append(oid)
                    self.add({"op": "free_mem", "id": oid})

    def gen_pyint(self):
        """allreduce of Python ints at the int64 edges and beyond (exact, any op)."""
        vals = []
        style = self.choice(["edge", "mixed", "mixed", "zeros"])
        for _ in range(self.P):
            if style == "zeros" and self.rng.random() < 0.7:
                vals.append(0)
            elif style == "edge" or self.rng.random() < 0.5:
                vals.append(self.choice(PYINTS))
            else:
                vals.append(_i(self.rng.integers(-50, 51)))
        self.add({"op": "pyint", "vals": vals, "red": self.choice(["sum", "prod", "min", "max"])})

    def mis_prof(self, name, mode, bad):
        if not self.prof:
            return None
        return {"op": "misuse_prof"}


# ============================================================ interpreter
