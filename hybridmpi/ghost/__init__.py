"""The ghost update, a wing of hybridmpi: :class:`~hybridmpi.Halo` (``halo.py``), the
:class:`~hybridmpi.GhostPattern` it runs (``pattern.py``; ``interop.py`` takes the lists of
DOLFINx's IndexMap and PETSc's ghosted vectors, ``_lists.py`` what both share) and the six
methods that move the bytes (``exchange/``).  It calls the comm (``hybridmpi.comm``) and the
native core, never the other wings.

Importing this package imports none of its modules (``hybridmpi.Halo`` loads them on first use).
"""
