"""Fixtures for the recorder tests: a fresh recording dir and a recorder that is always closed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from recording.writer import ParquetRecorder


@pytest.fixture
def rec_dir(tmp_path: Path) -> Path:
    return tmp_path / "rec"


@pytest.fixture
def make_recorder(rec_dir: Path) -> Iterator:
    made: list[ParquetRecorder] = []

    def make(**kw) -> ParquetRecorder:
        kw.setdefault("flush_interval_s", 0.1)
        kw.setdefault("fsync", False)
        r = ParquetRecorder(kw.pop("root", rec_dir), kw.pop("proxy_id", "p1"), **kw).start()
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()

