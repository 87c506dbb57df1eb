"""Lines of the library a user imports: every public name of ``hybridmpi`` loaded, then the
lines of each of its modules in ``sys.modules`` (the tools and the baselines are not loaded).

``python scripts/library_lines.py`` prints the total and, with ``-v``, each module."""

import sys

import hybridmpi


def main():
    for name in hybridmpi.__all__:
        getattr(hybridmpi, name)
    mods = sorted((m.__name__, m.__file__) for m in list(sys.modules.values())
                  if getattr(m, "__name__", "").startswith("hybridmpi")
                  and str(getattr(m, "__file__", "")).endswith(".py"))
    total = 0
    for name, path in mods:
        with open(path) as fh:
            n = sum(1 for _ in fh)
        total += n
        if "-v" in sys.argv:
            print(f"{n:6d} {name}")
    loaded_tools = [n for n, _ in mods if n.startswith("hybridmpi.tools")]
    extra = f" (tools loaded: {loaded_tools})" if loaded_tools else ""
    print(f"{total} lines in {len(mods)} modules{extra}")


if __name__ == "__main__":
    main()
