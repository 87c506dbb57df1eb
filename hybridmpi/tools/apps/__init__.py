"""Applications of the one-sided papers on the library: 3D heat conduction (DART-MPI) and the
Himeno benchmark (XcalableMP coarrays), each with every way of moving its halos."""

from .heat3d import Heat3D
from .himeno import Himeno

__all__ = ["Heat3D", "Himeno"]
