"""Sans-I/O Kafka wire-protocol decoder.

Nothing in this package touches sockets, asyncio or clocks: callers feed bytes
and timestamps in and take events out (see `protocol.stream.KafkaStream`).
"""
