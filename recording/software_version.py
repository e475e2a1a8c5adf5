"""Which kafkatap wrote a recording: the installed distribution's version.

Why here and not in the `kafkatap` package: the proxy stamps it on every run it
records (the `runs/` dataset), and the proxy may import `recording` but not the
command-line package above it. Read once, at import, from the installed
metadata; cheap (no pyarrow).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    KAFKATAP_VERSION = version("kafkatap")
except PackageNotFoundError:  # running from a source tree that was never installed
    KAFKATAP_VERSION = "0.0.0+source"
