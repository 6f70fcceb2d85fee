"""Process-wide settings the command line makes before any tensor exists.

Kept apart from engine.device so that the command line can apply them without importing torch first."""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt(3) parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 1 << 30) -> bool:
    """Stop glibc from handing freed tensor memory back to the OS after every step.

    PyTorch's CPU allocator does not cache; with glibc's defaults each step's freed activations are trimmed and
    page-faulted back in, which can cost half the CPU time (research log). Keeping up to `trim_threshold` bytes costs
    that much resident memory at most. Returns False where this is not glibc. Process-wide, so only the command line
    calls it; `GLIBC_TUNABLES` with malloc settings wins, and PRIVDISTILL_KEEP_FREED_MEMORY=0 turns it off."""
    if not sys.platform.startswith("linux") or os.environ.get("PRIVDISTILL_KEEP_FREED_MEMORY") == "0":
        return False
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        # An explicit mmap threshold also switches off glibc's sliding threshold, which is what lets
        # the trim threshold (2x the sliding one by default) stay small.
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return False
