"""Hooks by which a layer above follows a HybridComm that does not import it (a leaf).

The environment profile (env ``HYBRIDMPI_PROFILE``) starts with each HybridComm and ends at
its free.  The profile sits above what it measures, so the comm cannot import it: the package
registers the profile's start here when it is imported (``hybridmpi/__init__.py``, which every
import of a submodule runs first), and the comm calls what it finds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: fn(hc): start the environment profile of a new HybridComm
START_ENV_PROFILE: list[Callable[[Any], None]] = []
