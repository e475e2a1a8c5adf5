"""Where a secret ended up in a recording directory, for the tests that prove credentials are never kept.

Why decoded values: recordings are zstd-compressed Parquet, so a search of a file's raw bytes cannot find
a string stored inside it and such a check could never fail. Other files (logs, markers) are searched raw.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq


def values_holding(root: Path, secret: bytes) -> list[str]:
    """Every `file:column` under `root` whose decoded values hold `secret`, plus any other file whose bytes do."""
    found = []
    for f in (f for f in root.rglob("*") if f.is_file()):
        if f.suffix != ".parquet":
            if secret in f.read_bytes():
                found.append(str(f))
            continue
        table = pq.read_table(f)
        for name, column in zip(table.column_names, table.columns):
            for value in column.to_pylist():
                text = value if isinstance(value, bytes) else str(value).encode()
                if secret in text:
                    found.append(f"{f}:{name}")
                    break
    return found
