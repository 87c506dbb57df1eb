"""The profile, a wing of hybridmpi: :class:`hybridmpi.profile` and its table (``profile.py``),
which records what the comm, the Halos and global memory do while it is on.  It sits above what
it measures.

Importing this package imports none of its modules (``hybridmpi.profile`` loads them on first
use); the package is named apart from the class so that importing the module never shadows it.
"""
