"""The PMPI library (docs/pmpi.md): builds ``cext/hm_pmpi.c`` for an MPI and says where it is.

``hybridmpi pmpi path`` prints the path of the library for the MPI that mpi4py uses (or for the
one whose compiler wrapper ``--mpicc`` names), building it first when needed.  One build per
MPI: the library is compiled with the MPI's own wrapper and linked against the very ``libmpi``
that the programs load, so that its ``PMPI_*`` resolve to it whether a program links MPI or
Python opens it later.  Builds are kept in ``$HYBRIDMPI_PMPI_CACHE`` (default
``~/.cache/hybridmpi/pmpi``), named by a hash of the sources, the wrapper and the library.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import settings

#: the C sources compiled into the library: the entry points and the C core they run on
SOURCES = ("hm_pmpi.c", "hm_pmpi_cfg.c", "hm_pmpi_setup.c", "hm_pmpi_tune.c", "hm_pmpi_ngh.c",
           "hm_pmpi_ngh_graph.c", "hm_pmpi_ngh_plan.c", "hm_pmpi_ngh_op.c", "hm_pmpi_ngh_req.c", "hm_coll.c",
           "hm_coll_node.c", "hm_ops.c", "hm_net.c", "hm_halo.c", "hm_wait.c", "hm_prof.c", "hm_chaos.c")
HEADERS = ("hm_core.h", "hm_core_halo.h", "hm_wait.h", "hm_segment.h", "hm_pmpi_common.h", "hm_ngh.h")
#: the MPI families: MPICH's ABI (MPICH, Intel MPI: libmpi.so.12), Open MPI's (libmpi.so.40)
FAMILIES = ("mpich", "openmpi")


class PMPIError(RuntimeError):
    """The library cannot be built for this MPI (the message says why and what to do)."""


@dataclass(frozen=True)
class Target:
    """The MPI a build is for: its family, the libmpi programs load, the compiler wrapper."""

    family: str
    libmpi: Path
    mpicc: str


def sources() -> Path:
    """The folder of the C sources: ``cext/`` in a source tree, ``hybridmpi/_csrc`` installed."""
    here = Path(__file__).resolve().parent
    for folder in (here.parents[1] / "cext", here.parent / "_csrc"):
        if all((folder / name).is_file() for name in SOURCES + HEADERS):
            return folder
    raise PMPIError("the C sources of the PMPI library are not installed with hybridmpi")


def family_of(version: str) -> str:
    """The ABI family of an MPI from its library version string."""
    if "Open MPI" in version:
        return "openmpi"
    if "MPICH" in version or "Intel(R) MPI" in version or "MVAPICH" in version:
        return "mpich"
    raise PMPIError(f"no PMPI build for this MPI: {version.splitlines()[0] if version else '?'}")


def mpi4py_target() -> tuple[str, Path]:
    """The family and libmpi of the MPI that mpi4py loads (MPI itself is not started)."""
    import mpi4py

    mpi4py.rc.initialize = False
    from mpi4py import MPI

    family = family_of(MPI.Get_library_version())
    with open("/proc/self/maps") as f:
        libs = sorted({line.split()[-1] for line in f if "/libmpi" in line and ".so" in line})
    mains = [p for p in libs if Path(p).name.startswith(("libmpi.so", "libmpi_abi.so"))] or libs
    if not mains:
        raise PMPIError("cannot tell which libmpi mpi4py loads (no /proc/self/maps entry)")
    return family, Path(mains[0])


def wrapper_family(mpicc: str) -> str:
    """The family of the mpi.h that a compiler wrapper compiles with."""
    try:
        out = subprocess.run([*shlex.split(mpicc), "-E", "-dM", "-x", "c", "-"], input="#include <mpi.h>\n",
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PMPIError(f"cannot run the compiler wrapper {mpicc!r}: {e}") from None
    if out.returncode != 0:
        raise PMPIError(f"the compiler wrapper {mpicc!r} cannot compile <mpi.h>:\n{out.stderr.strip()}")
    if "#define OPEN_MPI " in out.stdout:
        return "openmpi"
    if "#define MPICH_VERSION " in out.stdout or "#define I_MPI_VERSION " in out.stdout:
        return "mpich"
    raise PMPIError(f"the compiler wrapper {mpicc!r} is for an MPI of no known family")


def _wrappers(libmpi: Path):
    """Compiler wrappers to try, most likely first: $MPICC, the one beside the library's
    installation, the one on PATH."""
    if settings.mpicc():
        yield settings.mpicc()
    for folder in (libmpi.parent.parent / "bin", Path(sys.prefix) / "bin"):
        if (folder / "mpicc").is_file():
            yield str(folder / "mpicc")
    found = shutil.which("mpicc")
    if found:
        yield found


def target(mpicc: str | None = None) -> Target:
    """The MPI to build for: mpi4py's, with a wrapper of its family (``mpicc`` if given)."""
    if mpicc is not None:
        fam = wrapper_family(mpicc)
        return Target(fam, _wrapper_libmpi(mpicc), mpicc)
    family, libmpi = mpi4py_target()
    tried = []
    for cand in dict.fromkeys(_wrappers(libmpi)):
        try:
            if wrapper_family(cand) == family:
                return Target(family, libmpi, cand)
            tried.append(f"{cand} (another MPI)")
        except PMPIError as e:
            tried.append(f"{cand} ({str(e).splitlines()[0]})")
    hint = ("pip install impi-devel" if "impi" in str(libmpi) or "intel" in str(libmpi).lower()
            else "the MPI's development package")
    raise PMPIError(f"no compiler wrapper of the {family} family for {libmpi} (tried: "
                    f"{', '.join(tried) or 'none found'}); install one ({hint}) or pass --mpicc")


def _wrapper_libmpi(mpicc: str) -> Path:
    """The libmpi that a compiler wrapper links (its -L folder)."""
    try:
        show = subprocess.run([*shlex.split(mpicc), "-show"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PMPIError(f"cannot run the compiler wrapper {mpicc!r}: {e}") from None
    for word in shlex.split(show):
        if word.startswith("-L"):
            for name in ("libmpi.so", "libmpi.so.12", "libmpi.so.40"):
                if (Path(word[2:]) / name).exists():
                    return (Path(word[2:]) / name).resolve()
    found = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout if shutil.which(
        "ldconfig") else ""
    for line in found.splitlines():
        if line.strip().startswith("libmpi.so ") and "=>" in line:
            return Path(line.split("=>")[1].strip()).resolve()
    raise PMPIError(f"cannot tell which libmpi {mpicc!r} links (no -L in `{mpicc} -show`)")


def cache_dir() -> Path:
    """Where builds are kept (settings.pmpi_cache_dir)."""
    return settings.pmpi_cache_dir()


def _compile_line(t: Target, src: Path, out: Path) -> list[str]:
    libdir = str(t.libmpi.parent)
    return [*shlex.split(t.mpicc), "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-std=gnu11",
            f"-I{src}", *(str(src / name) for name in SOURCES), "-o", str(out),
            f"-L{libdir}", f"-Wl,-rpath,{libdir}", f"-l:{t.libmpi.name}", "-ldl", "-lpthread", "-lrt"]


def library(mpicc: str | None = None, rebuild: bool = False, log=None) -> Path:
    """The path of the PMPI library for mpi4py's MPI (or ``mpicc``'s), built if needed."""
    t = target(mpicc)
    src = sources()
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update((src / name).read_bytes())
    h.update(f"{t.family}\0{t.libmpi.resolve()}\0{t.mpicc}".encode())
    folder = cache_dir() / f"{t.family}-{h.hexdigest()[:16]}"
    out = folder / "libhybridmpi_pmpi.so"
    if out.exists() and not rebuild:
        return out
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # two builds at once: the second finds the first's
        if out.exists() and not rebuild:
            return out
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            part = Path(tmp) / out.name
            line = _compile_line(t, src, part)
            if log is not None:
                log(f"# building the PMPI library for {t.family} ({t.libmpi}): {shlex.join(line)}")
            done = subprocess.run(line, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise PMPIError(f"building the PMPI library failed ({shlex.join(line)}):\n"
                                f"{done.stderr.strip()}")
            with contextlib.suppress(FileNotFoundError):
                out.unlink()
            os.replace(part, out)
    return out


__all__ = ["FAMILIES", "PMPIError", "Target", "cache_dir", "family_of", "library", "sources", "target"]
