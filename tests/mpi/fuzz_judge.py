"""The fuzzer's judge: the outcomes every rank saw of each step, gathered every few steps,
against the guarantees (tests/mpi/fuzz.py)."""

import faulthandler
import os

from fuzz_common import (
    BREAKING,
    GOOD_RAISE,
    KNOWN,
    MISUSE,
    PROMPT_S,
    SHORT_TIMEOUT,
    P,
    R,
    Rec,
    comm,
    first,
    isa,
    step_text,
)

#: steps of one-sided calls, which probe for failure notices before a call to another node
ONESIDED_CALLS = {"put", "get", "atomic", "co_put", "co_get"}


class Judge:
    """Checks and verdicts of a Program (a mixin of fuzz.Program)."""

    def check(self, final=False):
        """Gather every rank's records, evaluate on rank 0; True when the program failed."""
        self.wd.tick(f"program {self.seed}: check after step {self.order[-1][0] if self.order else -1}")
        faulthandler.dump_traceback_later(self.cfg.watchdog + 30, exit=True)
        mine = [r.tup() for r in self.recs]
        self.recs = []
        allrecs = comm.gather(mine, root=0)
        verdict = None
        if R == 0:
            verdict = self.evaluate(allrecs)
        verdict = comm.bcast(verdict, root=0)
        self.wd.tick(f"program {self.seed}: after the check")
        if verdict is not None:
            self.failure = verdict
            if R == 0:
                self.print_failure(verdict)
            return True
        return False

    def evaluate(self, allrecs):
        by = {}
        for r, recs in enumerate(allrecs):
            for t in recs:
                by.setdefault(tuple(t[0]), {})[r] = Rec(*t)
        keys = [k for k in self.order if k in by]
        self.order = [k for k in self.order if k not in by]
        for key in keys:
            m = self.meta[key]
            if m.get("withraise"):
                x = by[key].get(m["bad"])
                if x is not None and x.cls not in (None, "nocall"):
                    self.breaks.append((key, x.t0))
            # any rank whose comm broke (for one-sided calls: a notice before a call to
            # another node raises PeerError, docs/guide/reliability.md)
            t = min((x.t0 for x in by[key].values() if x.cls not in (None, "nocall")
                     and isa(x.cls, BREAKING | {"ValueError", "TypeError"})), default=None)
            if t is not None:
                self.any_breaks.append((key, t))
        for key in keys:
            for r, x in by[key].items():
                self.t0_at[(key, r)] = x.t0
        for n, key in enumerate(keys):
            recs = by[key]
            f = self.judge(key, recs)
            if f is not None:
                # a rank that ran ahead may have failed later in the batch, and its error
                # reached the others here: name the later calls that raised, to find the cause
                later = []
                for k in keys[n + 1 :]:
                    for r, x in sorted(by[k].items()):
                        if x.cls not in (None, "nocall") and all(r != q for q, _ in later):
                            later.append(
                                (
                                    r,
                                    f"step {k[0]}.{k[1]} ({self.describe(k)}): {first(x.cls)}: "
                                    f"{x.msg.splitlines()[0][:200] if x.msg else ''}",
                                )
                            )
                f["later"] = later
                return f
        return None

    def judge(self, key, recs):
        """The verdict on one call from every rank's record (None: fine)."""
        m = self.meta[key]
        cfg = self.cfg
        good_raise = set(GOOD_RAISE) | ({"ValueError"} if not cfg.strict else set())
        part = {r: x for r, x in recs.items() if x.cls != "nocall"}
        raised = {r: x for r, x in part.items() if x.cls is not None}

        def fail(kind, why):
            return {
                "kind": kind,
                "key": list(key),
                "why": why,
                "what": self.describe(key),
                "ranks": {r: (x.cls, x.msg, round(x.t1 - x.t0, 4), x.verr) for r, x in sorted(recs.items())},
            }

        def c(x):
            return first(x.cls)

        if m.get("reset"):  # a new HybridComm: nothing of the last one counts
            self.phase, self.broken, self.broken_why, self.broken_t = "clean", {}, {}, {}
            self.breaks = [b for b in self.breaks if b[0] > key]
            self.any_breaks = [b for b in self.any_breaks if b[0] > key]
        if m.get("deadline"):
            return self.judge_deadline(m, part, raised, fail)
        # anything, any time
        for r, x in part.items():
            if x.cls is not None and not isa(x.cls, KNOWN):
                return fail("crash", f"rank {r} raised {c(x)}, not one of the library's exceptions")
            # (the probe of a side comm after ranks in a constructor against others in a call:
            # a rank that had nothing to wait for there may wait here for peers that are still
            # waiting out the side comm's own timeout, and time out with them)
            side_probe = m.get("side") and m.get("probe") and x.t1 - x.t0 <= SHORT_TIMEOUT + PROMPT_S
            if isa(x.cls, {"SyncTimeout"}) and not side_probe:
                return fail("hang", f"rank {r} timed out (a wait that never ended)")
            if x.cls is not None and x.t1 - x.t0 > PROMPT_S and x.cls != "Skip" and not m.get("withraise"):
                return fail("slow", f"rank {r} raised {c(x)} after {x.t1 - x.t0:.2f} s (> {PROMPT_S} s)")
            if x.verr is not None:
                if x.vcat == "onesided" and self.phase != "clean":
                    continue
                return fail("wrong-value", f"rank {r}: {x.verr}")
        if m.get("probe"):
            # after a break: every call raises on every rank
            for r, x in part.items():
                if x.cls is None:
                    return fail("sticky", f"rank {r}'s call returned although the comm broke before")
                if not isa(x.cls, GOOD_RAISE | {"FreedError"}):
                    return fail(
                        "class", f"rank {r} raised {c(x)} on a broken comm (expected PeerError, RuntimeError)"
                    )
            if not m.get("side"):
                self.taint(key, raised, set())
            return self.note(key, raised)
        if m.get("lenient"):  # the free of a broken side comm: returns or raises, never waits
            for r, x in raised.items():
                if not isa(x.cls, GOOD_RAISE | {"FreedError", "Skip"}):
                    return fail("class", f"rank {r} raised {c(x)} freeing a broken comm")
            return self.note(key, raised)
        if m.get("withraise"):
            return self.judge_with(key, m, part, raised, fail)
        bad = m.get("bad")
        badset = set(range(P)) if bad == "all" else ({bad} if isinstance(bad, int) else set())
        exp = set(m.get("exp") or ())
        peer_ok = {"PeerError"} | ({"ValueError"} if not cfg.strict else set())
        if m.get("refmust") is not None:
            # the end of a begin that was invalid on one rank: its readers raise at the begin
            # or here, of the bad rank's class or PeerError
            ref = tuple(m["ref"])
            jcls = self.raised_at.get((ref, m["refbad"]))
            # another vector at the begin is no error where the method moves vectors as arrays
            # (the bad rank's begin returned): then every rank may complete
            allowed_ok = jcls is None and m.get("refmk") == "halo-vector-mismatch"
            for r in [] if allowed_ok else m["refmust"]:
                if r in part and part[r].cls is None and not self.raised_at.get((ref, r)):
                    return fail(
                        "disagree",
                        f"rank {r} completed the call although rank {m['refbad']} passed "
                        f"invalid arguments to its begin (and raised {jcls})",
                    )
            rexp = set(MISUSE[m["refmk"]][2])
            jname = (sorted(set(jcls.split("|")) & rexp) or [first(jcls)])[0] if jcls else None
            allowed = (
                peer_ok | ({jname} if jname else set()) | (good_raise if self.phase != "clean" else set())
            )
            if allowed_ok:
                # the begins all returned: the ranks find the other vector at the end, each
                # raising the misuse's own class (or a peer's error)
                allowed |= rexp
            for r, x in raised.items():
                if not isa(x.cls, allowed):
                    return fail(
                        "class",
                        f"rank {r} (right arguments) raised {c(x)} at the end of a call "
                        f"whose begin was invalid on rank {m['refbad']} (which raised {jcls}); "
                        f"expected {sorted(allowed)}",
                    )
            self.taint(key, raised, set())
            return self.note(key, raised)
        if self.phase == "clean":
            if not m.get("misuse"):
                bt = min((t for k, t in self.breaks if k > key), default=None)
                if (
                    raised
                    and bt is not None
                    and all(isa(x.cls, {"PeerError", "RuntimeError"}) and x.t1 >= bt for x in raised.values())
                ):
                    # a call before the break in program order, still running when a faster
                    # rank's own exception broke the comm (misuse_with)
                    self.taint(key, raised, set())
                    return self.note(key, raised)
                bt = min((t for k, t in self.any_breaks if k > key), default=None)
                if (
                    raised
                    and bt is not None
                    and self.steps[key[0]]["op"] in ONESIDED_CALLS
                    and all(isa(x.cls, {"PeerError"}) and x.t1 >= bt for x in raised.values())
                ):
                    # a one-sided call to another node made after a faster rank broke in a
                    # later step: the call probes for failure notices first and raises
                    self.taint(key, raised, set())
                    return self.note(key, raised)
                if raised:
                    r, x = next(iter(raised.items()))
                    return fail("raised", f"rank {r} raised {c(x)} in a valid call")
                return self.note(key, raised)
            mode = m["mode"]
            if mode == "nbo":
                # any rank may find the other Halo's message (ValueError) or a peer's error; no
                # rank returns wrong values (checked above); afterwards: consistent or raising
                for r, x in raised.items():
                    # RuntimeError: the Halo is unusable after this group's first error
                    if not isa(x.cls, {"ValueError", "PeerError", "RuntimeError"}):
                        return fail(
                            "class",
                            f"rank {r} raised {c(x)} for Halos begun in another order "
                            "(expected ValueError or PeerError)",
                        )
                if raised:
                    self.taint(key, raised, set())
                return self.note(key, raised)
            if m.get("may_succeed") and not raised:
                return self.note(key, raised)
            for r in badset:
                x = part.get(r)
                if x is None:
                    continue
                if x.cls is None:
                    if m.get("may_succeed"):
                        # another vector: the bad rank may find it only at the end (its values
                        # are checked), while a peer that reads its flags raises at once
                        continue
                    return fail("accepted", f"rank {r}'s invalid call ({m['mk']}) returned normally")
                if not isa(x.cls, exp):
                    return fail(
                        "class", f"rank {r}'s invalid call ({m['mk']}) raised {c(x)}, expected {sorted(exp)}"
                    )
            if mode == "one":
                # "the same class": the class the misuse must raise, which the bad rank raised
                jx = part.get(bad)
                jcls = (sorted(set(jx.cls.split("|")) & exp) or [first(jx.cls)])[0] if jx and jx.cls else None
                allowed = peer_ok | ({jcls} if jcls else set())
                for r, x in raised.items():
                    if r not in badset and not isa(x.cls, allowed):
                        return fail(
                            "class",
                            f"rank {r} (right arguments) raised {c(x)} while rank {bad} "
                            f"raised {jcls}; expected {sorted(allowed)}",
                        )
                for r in m.get("must", ()):
                    if r in part and part[r].cls is None:
                        return fail(
                            "disagree",
                            f"rank {r} returned normally although rank {bad}'s "
                            f"invalid call ({m['mk']}) reached it (rank {bad} raised {jcls})",
                        )
                    pc = m.get("peer_cls")
                    if pc and r in raised and r not in badset and not isa(raised[r].cls, {pc, "Skip"}):
                        return fail(
                            "class",
                            f"rank {r} raised {c(raised[r])} while rank {bad} raised {jcls}; expected {pc}",
                        )
                if (any(r not in badset for r in raised) or m.get("taints")) and not m.get("agreed"):
                    self.taint(key, raised, badset)
            return self.note(key, raised)
        # tainted: every call returns right values (checked above) or raises; a rank that
        # raised a breaking exception raises in every later call; a rank that needs a
        # broken rank's part raises; errors only of the allowed classes
        for r, x in raised.items():
            ok = good_raise | (exp if r in badset else set()) | {"Skip"}
            if not isa(x.cls, ok):
                return fail("class", f"rank {r} raised {c(x)} after an earlier error (allowed: {sorted(ok)})")
        if m.get("sync") and raised and not m.get("free"):   # (a free on a broken comm is local)
            # either usable and consistent (every rank returned, with right values) or every
            # call raises: a rank whose objects broke earlier does not return while others raise,
            # and a rank does not return without the part of a rank that broke earlier and raised
            deps = m.get("deps")
            for r, x in part.items():
                if m.get("images") and not deps.get(r) and not self.cfg.strict_local:
                    continue  # a call that names no peer (sync_images([])) is a local call
                if x.cls is None and self.broke_before(r, key, x):
                    return fail(
                        "sticky",
                        f"rank {r}'s call returned normally after it raised at step "
                        f"{self.broken[r][0]}.{self.broken[r][1]} ({self.broken_why[r]}), while rank "
                        f"{next(iter(raised))} raised in it",
                    )
            deps = m.get("deps")
            since = tuple(m.get("since", key))
            for s_, x in part.items():
                if x.cls is not None:
                    continue
                ds = range(P) if deps is None else deps.get(s_, ())
                for r in ds:
                    # rank r's part is owed when it broke before it began the call: for an end,
                    # before its begin, on rank r's own clock (a group's begin may run before
                    # an earlier step's call on that rank, and send its part: fuzz finding 46)
                    began = self.t0_at.get((since, r), raised[r].t0 if r in raised else 0.0)
                    if (r != s_ and r in raised and r in self.broken and self.broken[r] < since
                            and self.broken_t[r] <= began):
                        return fail(
                            "disagree",
                            f"rank {s_} returned normally although rank {r}, whose part "
                            f"it needs, had failed at step {self.broken[r][0]} ({self.broken_why[r]}) "
                            "and raised",
                        )
        elif m.get("local") and self.cfg.strict_local:
            for r, x in part.items():
                if x.cls is None and self.broke_before(r, key, x):
                    return fail(
                        "sticky-local",
                        f"rank {r}'s local call returned normally after its "
                        f"HybridComm broke at step {self.broken[r][0]}",
                    )
        self.taint(key, raised, badset)
        return self.note(key, raised)

    def judge_with(self, key, m, part, raised, fail):
        """Rank ``bad``'s own exception left a with block: it raises it; the others PeerError
        within 2 s of it (or return right values when they needed nothing of it); the comm is
        broken from then on."""
        bad = m["bad"]
        b = part.get(bad)
        if b is not None and b.cls != "Skip":
            if b.cls is None or not isa(b.cls, {"OwnError"}):
                return fail(
                    "class", f"rank {bad}'s own exception in a with block became {b.cls or 'a return'}"
                )
        tb = b.t0 if b is not None else None
        # on a comm that an earlier step broke, every call raises RuntimeError ("unusable")
        ok = {"PeerError", "Skip"} | (GOOD_RAISE if self.phase != "clean" else set())
        for r, x in raised.items():
            if r == bad:
                continue
            if not isa(x.cls, ok):
                return fail(
                    "class",
                    f"rank {r} raised {first(x.cls)} while rank {bad}'s own exception left a with block "
                    f"(expected {' or '.join(sorted(ok - {'Skip'}))})",
                )
            if tb is not None and x.t1 - max(tb, x.t0) > PROMPT_S:
                return fail(
                    "slow", f"rank {r} raised {x.t1 - max(tb, x.t0):.2f} s after rank {bad}'s exception"
                )
        for r in m.get("must", ()):
            if r in part and part[r].cls is None:
                return fail(
                    "disagree",
                    f"rank {r} returned although its call needs rank {bad}, whose own exception left "
                    "a with block",
                )
        self.phase = "tainted"
        if b is not None and b.cls not in (None, "Skip"):
            self.broken[bad] = key
            self.broken_t[bad] = b.t1
            self.broken_why[bad] = "its own exception left a with block"
        self.taint(key, {r: x for r, x in raised.items() if r != bad}, set())
        return self.note(key, raised)

    def judge_deadline(self, m, part, raised, fail):
        """Ranks in a constructor against ranks in a call: every rank that needs the others
        raises SyncTimeout or PeerError, each within 2 s of the first (a side comm: the
        program's own comm is untouched)."""
        for r, x in part.items():
            if x.cls is not None and not isa(x.cls, KNOWN):
                return fail("crash", f"rank {r} raised {first(x.cls)}, not one of the library's exceptions")
            if x.verr is not None:
                return fail("wrong-value", f"rank {r}: {x.verr}")
        t_first = min((x.t1 for x in raised.values()), default=None)
        for r, x in raised.items():
            ok = {"SyncTimeout", "PeerError", "Skip"}
            if x.t0 >= t_first:  # came after the first rank raised: its comm may know already
                ok.add("RuntimeError")
            if not isa(x.cls, ok):
                return fail("class", f"rank {r} raised {first(x.cls)}, expected {sorted(ok)}")
            if x.t1 - t_first > PROMPT_S:
                return fail(
                    "slow", f"rank {r} raised {x.t1 - t_first:.2f} s after the first rank (> {PROMPT_S} s)"
                )
        for r in m["must"]:
            if r in part and part[r].cls is None:
                side = "a constructor" if r in m["ctor"] else "its call"
                return fail(
                    "disagree",
                    f"rank {r} returned from {side} although ranks {m['ctor']} were in a constructor "
                    f"and the others in {m['call']}",
                )
        return None

    def broke_before(self, r, key, x):
        """Whether rank ``r`` raised a breaking exception before its call ``x`` (of ``key``):
        earlier in program order and, in a group whose order differs between ranks, earlier
        on that rank's own clock."""
        return r in self.broken and self.broken[r] < key and self.broken_t[r] <= x.t0

    def note(self, key, raised):
        for r, x in raised.items():
            self.raised_at[(key, r)] = x.cls
        return None

    def taint(self, key, raised, badset):
        self.phase = "tainted"
        for r, x in raised.items():
            if r in badset and isa(x.cls, self.meta[key].get("exp") or ()):
                continue
            if isa(x.cls, BREAKING) and r not in self.broken:
                self.broken[r] = key
                self.broken_t[r] = x.t1
                self.broken_why[r] = f"{first(x.cls)}: {x.msg.splitlines()[0][:160] if x.msg else ''}"

    # ------------------------------------------------------------ reporting

    def report_header(self, kind):
        c = self.cfg
        env = " ".join(
            f"{k}={os.environ[k]}"
            for k in ("HYBRIDMPI_CHAOS", "MPIR_CVAR_NUM_CLIQUES", "HYBRIDMPI_TIMEOUT")
            if k in os.environ
        )
        opts = [f"--seed {self.seed}", "--programs 1", f"--steps {c.steps}"]
        if c.node_size:
            opts.append(f"--node-size {c.node_size}")
        opts.append(f"--methods {','.join(c.methods)}")
        opts.append(f"--misuse {int(c.misuse)}")
        if c.kinds_arg:
            opts.append(f"--misuse-kinds={c.kinds_arg}")
        opts.append(f"--same-order {','.join(c.same_order) or 'none'}")
        if c.avoid:
            opts.append(f"--avoid {','.join(sorted(c.avoid))}")
        if c.check_every:
            opts.append(f"--check-every {c.check_every}")
        if c.slow_misuse != 0.2:
            opts.append(f"--slow-misuse {c.slow_misuse:g}")
        if not c.restart:
            opts.append("--restart 0")
        if not c.strict:
            opts.append("--strict 0")
        if c.keep_arg:
            opts.append(f"--keep {c.keep_arg}")
        if c.program:
            opts.append(f"--program {c.program}")
        return (
            f"FUZZ FAILURE ({kind}) program seed {self.seed}, {P} ranks\n"
            f"  replay: {env + ' ' if env else ''}mpiexec -n {P} python -m mpi4py tests/mpi/fuzz.py "
            f"{' '.join(opts)} --replay"
        )

    def listing(self, upto=None):
        lines = ["  steps:"]
        for st in self.steps:
            if upto is not None and st["i"] > upto:
                lines.append(f"    ... ({len(self.steps) - upto - 1} more)")
                break
            if (
                self.cfg.keep is not None
                and st["i"] not in self.cfg.keep
                and st["op"] not in ("hc", "hc_free", "after_free")
            ):
                continue
            lines.append(f"    {st['i']:4d}: {step_text(st)}")
        return "\n".join(lines)

    def print_failure(self, f):
        print(self.report_header(f["kind"]), flush=True)
        print(f"  at step {f['key'][0]}.{f['key'][1]}: {f['what']}\n  why: {f['why']}", flush=True)
        for r, (cls, msg, dt, verr) in f["ranks"].items():
            line = f"    rank {r}: {cls or 'returned'}"
            if cls not in (None, "nocall"):
                line = f"    rank {r}: {cls.replace('|', ' < ')}"
                line += f" after {dt:.4f} s: {msg.splitlines()[0][:300] if msg else ''}"
                if not isa(cls, KNOWN) and msg:
                    line += "\n" + "\n".join("        " + x for x in msg.splitlines()[1:])
            if verr:
                line += f"; value: {verr[:600]}"
            print(line, flush=True)
        for r, what in f.get("later", []):
            print(f"  later on rank {r}: {what}", flush=True)
        print(self.listing(upto=f["key"][0] + 3), flush=True)

    # ============================================================ steps
