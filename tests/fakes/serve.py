"""Run an asyncio server object (``start()``/``stop()`` coroutines) in a loop on its own thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def serving(srv: Any) -> Iterator[Any]:
    """``srv`` started in an event loop of its own thread until the block ends (as in the guard's loop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(srv.start(), loop).result(10)
        yield srv
    finally:
        asyncio.run_coroutine_threadsafe(srv.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
