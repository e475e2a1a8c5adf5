"""The replay engine: one asyncio task per recorded connection, sending recorded frames to a target.

Why this shape:
* **One replay connection per recorded connection**, opened at the recorded
  offset (scaled by the speed) so the broker sees the same connection
  pattern, and requests on it in the recorded order.
* **Timing.** `speed` 1.0/2.0: each request at its recorded offset from the
  recording's start divided by the speed. `max`: requests go out in the
  recorded global order as fast as the target allows, keeping the recorded
  pipelining: a request waits for exactly the responses its client had
  already received when it sent it (from `requests/`), no more, no less.
  In every mode a request also waits for those responses (a client cannot
  send what depends on an answer it has not had), and the wait is counted.
* **State flows from responses.** Every target response goes through the pure
  `learn_from_response`; a request whose rewrite needs state not learned yet
  (`Pending`) waits for the next response and is skipped with its reason
  after `pending_timeout`.
* **Recording the replay.** With `record_dir`, the engine runs a normal
  kafkatap proxy on its own loop in front of the target and connects through
  it, so the output is an ordinary recording that `kafkatap analyze
  --compare` reads like any other. On a SASL target that proxy's own
  topic-name query is off (it cannot authenticate); the target's relayed
  answers name the topics.
* **Nothing is silent.** Every request ends as sent (answered / failed /
  unanswered-by-design for acks=0) or skipped with a reason; the totals are
  the result.

This module is the schedule, the totals and the proxy wiring; what happens
on one connection is `replay.connection`, getting the target ready before
the first request is `replay.target`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

import structlog
import uvloop

from replay.connection import replay_connection
from replay.load import Recording
from replay.schedule import ReplayOptions, ReplayResult, ReplaySchedule
from replay.target import hostport, prepare_target

log = structlog.get_logger("kafkatap.replay")

__all__ = ["ReplayOptions", "ReplayResult", "Replayer", "ReplayInterrupted", "run_replay", "replay_async",
           "prepare_target"]


class ReplayInterrupted(Exception):
    """Ctrl-C or SIGTERM ended the replay: what it had done so far (`result`) and the signal's number.

    Why an exception of its own: the CLI owes the operator the partial summary and a shell-style exit status
    (128 + the signal), not click's bare "Aborted!"; the engine has already closed the connections and the
    replay's own recording by the time it is raised.
    """

    def __init__(self, result: ReplayResult, signum: int, total: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.result = result
        self.signum = signum
        self.total = total  # requests the replay was to send


# --------------------------------------------------------------------------- the replay
class Replayer(ReplaySchedule):
    """Runs one replay on the current event loop (see the module docstring)."""

    # -- run -------------------------------------------------------------------
    async def run(self, host: str, port: int) -> ReplayResult:
        loop = asyncio.get_running_loop()
        self.result.started_ns = time.time_ns()
        self._t0 = loop.time() + 0.05
        if self.opt.progress is not None:
            self._progress_task = asyncio.create_task(self._progress())
        try:
            outcomes = await asyncio.gather(*(replay_connection(self, c, host, port) for c in self.rec.connections),
                                            return_exceptions=True)
            for c, out in zip(self.rec.connections, outcomes):
                if isinstance(out, BaseException):  # a bug must cost one connection, not the replay
                    log.error("replay connection failed", conn_id=c.conn_id, error=f"{type(out).__name__}: {out}")
                    self.result.failures[f"internal error: {type(out).__name__}"] += 1
                    self.result.failed += 1  # counted in the totals too: the summary's failed are the lines below it
        finally:  # also when interrupted: the partial summary shows what was learned and when it stopped
            if self._progress_task is not None:
                self._progress_task.cancel()
                self._print_progress(final=True)
            self.result.notes = dict(self.state.notes)
            self.result.finished_ns = time.time_ns()
        r = self.result
        log.info("replay finished", connections=r.connections, sent=r.sent, answered=r.answered, failed=r.failed,
                 skipped=dict(r.skipped), closed_by_target=len(r.closed_by_target), span_s=round(r.span_s, 3))
        return self.result

    # -- progress ----------------------------------------------------------------
    def _print_progress(self, final: bool = False) -> None:
        out = self.opt.progress
        if out is None:
            return
        r = self.result
        total = self.rec.requests + sum(self.rec.skipped.values())
        line = (f"replay: sent {r.sent}/{self.rec.requests}  answered {r.answered}  failed {r.failed}  "
                f"skipped {sum(r.skipped.values())}  (of {total})")
        tty = getattr(out, "isatty", lambda: False)()
        if tty:
            out.write("\r" + line + ("\n" if final else ""))
        else:
            out.write(line + "\n")
        out.flush()

    async def _progress(self) -> None:
        tty = getattr(self.opt.progress, "isatty", lambda: False)()
        while True:
            await asyncio.sleep(0.2 if tty else 5.0)
            self._print_progress()


async def replay_async(recording: Recording, options: ReplayOptions, replayer: Replayer | None = None) -> ReplayResult:
    """Set the target up, then replay (through a recording proxy with `record_dir`, which is closed whatever happens).

    `replayer`: the caller's, so that it still holds the totals when the replay is cancelled (`run_replay`).
    """
    replayer = replayer or Replayer(recording, options)
    created = await prepare_target(options.target, recording, replayer.state, options.create_topics,
                                   options.connect_timeout, sasl_plain=options.sasl_plain)
    replayer.result.topics_created = created
    if options.record_dir is None:
        host, port = hostport(options.target)
        return await replayer.run(host, port)
    from proxy.server import ProxyServer
    from proxy.sinks import build_sinks

    sinks = build_sinks(options.record_dir, options.proxy_id, capture="requests",
                        flush_interval_s=options.flush_interval_s, compact_interval_s=0)
    # The proxy names topics from the target's relayed answers first; its own Metadata query is a fallback that
    # cannot authenticate, so a SASL listener hangs up on it and the proxy warned mid-replay that it had failed.
    resolve_topics = not replayer.state.target_takes_sasl
    if not resolve_topics:
        log.info("replay recording: topic names come from the target's answers only (the recording proxy's own "
                 "Metadata query cannot authenticate to a SASL listener)", target=options.target)
    server = ProxyServer([f"127.0.0.1:0={options.target}"], sink=sinks.sink, proxy_id=options.proxy_id,
                         capture="requests", tcp_info_interval=None, resolve_topics=resolve_topics,
                         bypass_check=False)  # every session is sent here, whatever the target advertises
    try:
        await server.start()
        host, port = server.listen_addr
        result = await replayer.run(host, port)
    finally:
        await server.stop(timeout=5.0)  # closes the sink: the replay's recording is complete
    result.record_dir = options.record_dir
    return result


def run_replay(recording: Recording, options: ReplayOptions) -> ReplayResult:
    """Run a replay to completion on a fresh uvloop loop (the synchronous entry point).

    Ctrl-C (asyncio.Runner's own handling) and SIGTERM cancel the replay's task, so every connection and the
    recording proxy close as they do at the end; then `ReplayInterrupted` carries the totals so far.
    """
    replayer = Replayer(recording, options)
    received: list[int] = []

    async def main() -> ReplayResult:
        with _sigterm_cancels(asyncio.current_task(), received):
            return await replay_async(recording, options, replayer)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        try:
            return runner.run(main())
        except KeyboardInterrupt:
            raise ReplayInterrupted(replayer.result, signal.SIGINT, recording.requests) from None
        except asyncio.CancelledError:
            if not received:
                raise
            raise ReplayInterrupted(replayer.result, received[0], recording.requests) from None


@contextlib.contextmanager
def _sigterm_cancels(task: asyncio.Task | None, received: list[int]) -> Iterator[None]:
    """While the replay runs, SIGTERM cancels `task` (noted in `received`) as asyncio.Runner does for Ctrl-C.

    Why on the loop, not a Python handler raising: an exception raised wherever the main thread happens to be
    can land inside the loop's own machinery; a cancelled task unwinds through every `finally` (connections
    closed, the recording proxy stopped and its files complete). Only the main thread can own signal handlers:
    elsewhere (a test's thread) SIGTERM keeps its own behaviour.
    """
    if task is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    before = signal.getsignal(signal.SIGTERM)

    def on_sigterm() -> None:
        received.append(signal.SIGTERM)
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


def default_progress() -> TextIO:
    return sys.stderr
