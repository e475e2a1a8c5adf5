"""A `ProxyServer` on its own thread and uvloop loop, for synchronous callers.

Why apart from the server: tests, scenarios, replay and benchmarks drive the
proxy from ordinary blocking code (real Kafka clients, subprocesses), while the
server itself is pure asyncio. This wrapper owns the thread and the loop and
nothing else; everything it does goes through the server's public API.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import Callable, Sequence
from typing import Any

from proxy.faults import Faults
from proxy.memory_tuning import FIRST_GENERATION, GC_THRESHOLDS, settle_memory
from proxy.server import ProxyServer, Route

_settled = False  # settle_memory() once per process: later proxies only get the thresholds back


def _settle_memory_once() -> None:
    """The collector and allocator settings of `kafkatap proxy`, so tests and benchmarks run the relay people run.

    The first proxy of a process freezes what is alive (a full collection first); later ones
    only restore the collector's thresholds (something may have reset them), since each
    collect + freeze costs a full collection of a possibly large test process.
    """
    global _settled
    if not _settled:
        settle_memory()
        _settled = True
    elif gc.get_threshold()[0] < FIRST_GENERATION:
        gc.set_threshold(*GC_THRESHOLDS)


class RunningProxy:
    """A ProxyServer on its own thread and uvloop loop, for synchronous code.

        with RunningProxy(upstream=kafka.bootstrap, sink=sink) as p:
            produce(p.bootstrap)

    Keyword arguments are passed to ProxyServer. `upstream` is a shortcut for one
    explicit route listening on 127.0.0.1:0. The process's garbage collector and
    allocator are set up as `kafkatap proxy` sets them
    (`proxy.memory_tuning.settle_memory`) unless `settle_memory=False`.
    """

    def __init__(self, routes: Sequence[Route | str] | None = None, *, upstream: str | None = None,
                 listen: str = "127.0.0.1:0",
                 thread_context: Callable[[], contextlib.AbstractContextManager] | None = None,
                 settle_memory: bool = True, **kwargs: Any) -> None:
        if routes is None:
            if upstream is None:
                raise ValueError("give routes or upstream")
            routes = [f"{listen}={upstream}"]
        self._routes = routes
        self._kwargs = kwargs
        # entered on the proxy thread before its loop exists, e.g. `lambda: host.entered()` to run
        # the proxy inside a network namespace (setns is per thread)
        self._thread_context = thread_context
        self._settle_memory = settle_memory
        self.server: ProxyServer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop_future: asyncio.Future | None = None

    def start(self) -> RunningProxy:
        if self._settle_memory:
            _settle_memory_once()
        self._thread = threading.Thread(target=self._main, name="kafkatap-proxy", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        import uvloop

        with contextlib.ExitStack() as stack:
            try:
                if self._thread_context is not None:
                    stack.enter_context(self._thread_context())
            except BaseException as exc:  # noqa: BLE001
                self._error = exc
                self._ready.set()
                return
            loop = uvloop.new_event_loop()
            self.loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._amain())
            except BaseException as exc:  # noqa: BLE001
                self._error = exc
                self._ready.set()
            finally:
                loop.close()

    async def _amain(self) -> None:
        try:
            self.server = ProxyServer(self._routes, **self._kwargs)
            await self.server.start()
            self._stop_future = asyncio.get_running_loop().create_future()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        timeout = await self._stop_future
        await self.server.stop(timeout)

    @property
    def listen_addr(self) -> tuple[str, int]:
        assert self.server is not None
        return self.server.listen_addr

    @property
    def listen_addrs(self) -> list[tuple[str, int]]:
        assert self.server is not None
        return self.server.listen_addrs

    @property
    def bootstrap(self) -> str:
        """"host:port" of the first listener, ready for bootstrap_servers."""
        h, p = self.listen_addr
        return f"{h}:{p}"

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on the proxy's loop thread and return its result."""
        assert self.loop is not None
        done = threading.Event()
        box: list[Any] = []

        def run() -> None:
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001
                box.append((False, exc))
            done.set()

        self.loop.call_soon_threadsafe(run)
        done.wait()
        ok, val = box[0]
        if not ok:
            raise val
        return val

    def set_faults(self, faults: Faults | None) -> None:
        """Change faults for new connections (thread-safe)."""
        assert self.server is not None
        self.call(self.server.set_faults, faults)

    def open_connections(self) -> int:
        assert self.server is not None
        return self.call(lambda: self.server.open_connections)

    def stop(self, timeout: float | None = 5.0) -> None:
        """Graceful stop (in-flight requests get `timeout` s), sink flushed; joins the thread."""
        if self._thread is None or self.loop is None or self._stop_future is None:
            return
        fut = self._stop_future
        self.loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(timeout))
        self._thread.join()
        self._thread = None

    def __enter__(self) -> RunningProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
