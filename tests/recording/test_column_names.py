"""recording/column_names.py is what `python -m recording.schema --names` generates from the schema today.

Why: the proxy process takes its row keys and its writer's tuple order from that generated module, so
that it never imports pyarrow; a column added to the schema without regenerating it would shift every
value of a shipped request row into the wrong column.
"""

from __future__ import annotations

from pathlib import Path

from recording import schema
from recording.datasets import COLUMN_NAMES, DERIVED_COLUMNS, TCP_FIELD_NAMES, row_names
from recording.timestamps import ingest_schema

GENERATED = Path(schema.__file__).with_name("column_names.py")


def test_the_generated_names_are_current() -> None:
    assert GENERATED.read_text() == schema.column_names_module(), (
        "recording/column_names.py is stale: run `python -m recording.schema --names > recording/column_names.py`")


def test_every_dataset_and_the_tcp_struct_have_their_schema_names() -> None:
    assert set(COLUMN_NAMES) == set(schema.DATASETS)
    for name in schema.DATASETS:
        assert COLUMN_NAMES[name] == tuple(schema.arrow_schema(name).names), name
    assert TCP_FIELD_NAMES == tuple(schema.TCP_STRUCT.names)


def test_a_shipped_row_carries_the_ingest_columns_but_the_derived_ones() -> None:
    for name in schema.RECORDED:
        expected = tuple(n for n in ingest_schema(name).names if n not in DERIVED_COLUMNS.get(name, ()))
        assert row_names(name) == expected, name
    assert "latency_us" in COLUMN_NAMES["requests"] and "latency_us" not in row_names("requests")


def test_the_readme_tables_are_the_schema_s() -> None:
    """The README's column tables are `markdown_table`'s: a description changed in one place only drifts."""
    readme = (Path(schema.__file__).parents[1] / "README.md").read_text()
    for name in schema.DATASETS:
        head = f"### `{name}/`\n\n"
        assert head in readme, f"README has no table for {name}/"
        start = readme.index(head) + len(head)
        assert readme[start:readme.index("\n\n", start)] == schema.markdown_table(name).rstrip("\n"), (
            f"README's {name}/ table is not the schema's: regenerate it with `python -m recording.schema`")
