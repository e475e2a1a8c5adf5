"""Kernel-visible names for the recorder's threads, so that `top -H` tells their CPU apart from the relay's."""

from __future__ import annotations


def name_os_thread(name: bytes) -> None:
    """Give the calling thread a name in /proc/PID/task/*/comm (PR_SET_NAME, at most 15 bytes)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)  # PR_SET_NAME
    except Exception:  # noqa: BLE001 — cosmetic only
        pass
