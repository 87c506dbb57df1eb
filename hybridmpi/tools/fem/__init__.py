"""Finite elements on the library: P1 Poisson with Jacobi-preconditioned conjugate gradients."""

from .poisson import Poisson, solve_poisson
from .problems import exact, rhs

__all__ = ["Poisson", "exact", "rhs", "solve_poisson"]
