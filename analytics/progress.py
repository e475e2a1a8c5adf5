"""Readable progress on stderr while Spark works (instead of Spark's console bar).

Each step prints one line; a background thread adds a line with Spark's task
counts when a step runs longer than a few seconds, so a long 10 M-row step
shows it is alive without flooding the terminal or a CI log.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from pyspark.sql import SparkSession


class Progress:
    def __init__(self, spark: SparkSession | None, enabled: bool = True, stream: TextIO | None = None, every_s: float = 5.0):
        self.spark = spark
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self.t0 = time.monotonic()
        self.step_name = ""
        self.step_t0 = self.t0
        self.timings: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _print(self, text: str) -> None:
        if self.enabled:
            print(f"[analyze {time.monotonic() - self.t0:6.1f}s] {text}", file=self.stream, flush=True)

    def step(self, name: str, detail: str = "") -> None:
        """Close the previous step (recording its time) and start a new one."""
        now = time.monotonic()
        if self.step_name:
            self.timings[self.step_name] = round(now - self.step_t0, 3)
        self.step_name, self.step_t0 = name, now
        if name:
            self._print(f"{name}{' — ' + detail if detail else ''}")

    def info(self, text: str) -> None:
        self._print(text)

    def _watch(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(1.0):
            if self.spark is None or time.monotonic() - self.step_t0 < self.every_s or time.monotonic() - last < self.every_s:
                continue
            try:
                tracker = self.spark.sparkContext.statusTracker()
                parts = []
                for sid in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(sid)
                    if info:
                        parts.append(f"stage {sid}: {info.numCompletedTasks}/{info.numTasks} tasks")
                if parts:
                    self._print(f"  … {self.step_name}: " + ", ".join(parts))
                    last = time.monotonic()
            except Exception:
                return

    def __enter__(self) -> "Progress":
        if self.enabled and self.spark is not None:
            self._thread = threading.Thread(target=self._watch, name="kafkatap-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.step("")
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
