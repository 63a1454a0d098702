"""An asynchronous load that runs once per process: what the gateway reads back from the CommitLog at start
(open transactions, open pop checkpoints) before the first request that needs it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["LoadOnce"]


class LoadOnce:
    """The first caller runs ``load``; callers meanwhile wait for it; a load that failed is run again by the
    next caller (the failure is raised to those that waited)."""

    def __init__(self, load: Callable[[], Awaitable[None]]) -> None:
        self._load = load
        self._future: asyncio.Future[None] | None = None

    @property
    def done(self) -> bool:
        """Loaded, and without failure."""
        f = self._future
        return f is not None and f.done() and f.exception() is None

    async def __call__(self) -> None:
        if self._future is None:
            self._future = asyncio.get_running_loop().create_future()
            try:
                await self._load()
            except BaseException as e:
                future, self._future = self._future, None
                future.set_exception(e)
                future.exception()  # retrieved: nobody else need be waiting
                raise
            self._future.set_result(None)
        await asyncio.shield(self._future)
