"""The recording proxy: sockets, timing, TCP health, fault injection, recording.

All asyncio and syscalls of kafkatap live here; `protocol/` only observes.
"""
