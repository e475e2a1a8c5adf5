"""The recording format, owned in one place: its schema, its writer and its one reader.

Why a package of its own: the proxy writes recordings, analytics (Spark) and
replay (Arrow) read them, and all three must agree on the columns, the file
layout, the format version and which files are live. Nothing here imports the
proxy, analytics or replay; they import this.
"""
