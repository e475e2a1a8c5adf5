"""kafkatap: a transparent recording proxy for Apache Kafka.

The distribution is split into the packages named in the architecture document
(`protocol`, `proxy`, `analytics`, `scenarios`); this package only holds the
command-line entry point (process-wide logging is `recording.logs`: every process kafkatap starts, the
recording's writer process included, sets it up the same way).
"""

from recording.software_version import KAFKATAP_VERSION as __version__

__all__ = ["__version__"]
