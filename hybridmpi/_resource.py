"""What every collective object with a ``free()`` shares: the ``with`` statement frees it
(unless an exception that ends the job leaves it: see :func:`~hybridmpi.abort_on_error`)."""

from __future__ import annotations

from typing import Any

from ._jobs import ends_job


class Freed:
    """``with obj:`` calls ``obj.free()`` at the end of the block (collective, idempotent)."""

    def free(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[1] is not None and ends_job(exc[1]):
            return  # abort_on_error ends the job: no collective free for a peer to miss
        self.free()
