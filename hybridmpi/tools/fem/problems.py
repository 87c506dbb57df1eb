"""The manufactured solution of the checks: u = sin(πx) sin(πy) sin(πz) + x on the unit cube."""

import numpy as np


def exact(p: np.ndarray) -> np.ndarray:
    """u(x, y, z) = sin(πx) sin(πy) sin(πz) + x; also the Dirichlet data g."""
    p = np.asarray(p)
    return np.sin(np.pi * p[:, 0]) * np.sin(np.pi * p[:, 1]) * np.sin(np.pi * p[:, 2]) + p[:, 0]


def rhs(p: np.ndarray) -> np.ndarray:
    """f = -Δu = 3π² sin(πx) sin(πy) sin(πz)."""
    p = np.asarray(p)
    return 3 * np.pi**2 * np.sin(np.pi * p[:, 0]) * np.sin(np.pi * p[:, 1]) * np.sin(np.pi * p[:, 2])
