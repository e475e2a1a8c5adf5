"""The recording format, owned in one place: its schema, its writer and its one reader.

Why a package of its own: the proxy writes recordings, analytics (Spark) and
replay (Arrow) read them, and all three must agree on the columns, the file
layout, the format version and which files are live. Nothing here imports the
proxy, analytics or replay; they import this.

    datasets.py     the names without the types: format version, datasets, each row's columns (no pyarrow:
                    the proxy process imports this, never pyarrow)
    column_names.py every dataset's column names, generated from schema.py (`python -m recording.schema --names`)
    schema.py       the columns of every dataset (`python -m recording.schema` prints the README tables)
    layout.py       directories, file names, the superseded rule, crash recovery
    files.py        one Parquet file: footer keys, written atomically
    writer.py       ParquetRecorder: rows off the event loop into flush files
    compaction.py   flush files merged into one file per segment
    thread_names.py kernel-visible names for the recorder's threads
    cores.py        the cores this process may run on (the proxy's default --workers, the analysis's JIT)
    migrations.py   format versions: the one check and the one migration registry
    reader.py       the one reader: live files (pyarrow.fs), versions, Arrow tables
    timespec.py     the --since/--until syntax analyze and replay share
    fault_notes.py  which errors in a row's answer a Kafka fault injected, read from its `edit` note (no pyarrow:
                    the writer's sums, the proxy's live counters and the Spark twin's test read it alike)
    sample_rows.py  synthetic rows for tests and the recording benchmark
"""
