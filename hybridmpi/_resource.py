"""What every collective object with a ``free()`` shares: the ``with`` statement frees it."""

from __future__ import annotations

from typing import Any


class Freed:
    """``with obj:`` calls ``obj.free()`` at the end of the block (collective, idempotent)."""

    def free(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()
