"""Give the memory a burst of media requests used back to the OS (glibc's malloc_trim), in the HTTP process.

Why it is needed: decoding holds request bodies, base64 strings, decoded frames and features, each megabytes, from
several pool threads at once. glibc serves those from per-thread arenas and raises its mmap threshold after the
first large free, so later large buffers come from the arenas' heaps; freed, they stay in the process (a 50-request
burst left the HTTP process ~450 MB above its start). malloc_trim(0) returns every arena's free pages.

When: media decoding marks the process "dirty" for TRIM_WINDOW_S; while dirty, a daemon thread trims every
TRIM_PERIOD_S once no decode is running (bodies of requests still generating are freed when they finish, within the
window for short answers). ctypes releases the GIL for the call, so the loop keeps running while it walks the arenas.
Without glibc (musl, macOS) this is a no-op.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading
import time
from typing import Callable, Iterator, Optional

TRIM_WINDOW_S = 15.0
TRIM_PERIOD_S = 1.0


def _load_malloc_trim() -> Optional[Callable[[int], int]]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class MediaMemoryReleaser:
    def __init__(self, window_s: float = TRIM_WINDOW_S, period_s: float = TRIM_PERIOD_S):
        self.window_s = window_s
        self.period_s = period_s
        self._trim = _load_malloc_trim()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._active = 0
        self._dirty_until = 0.0
        self._thread: Optional[threading.Thread] = None
        self.trims = 0  # calls made (for tests and logs)

    @contextlib.contextmanager
    def job(self) -> Iterator[None]:
        """Wrap one request's media decoding."""
        with self._lock:
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                self._dirty_until = time.monotonic() + self.window_s
                if self._trim is not None and self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="sglang-media-trim", daemon=True)
                    self._thread.start()
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(self.period_s)
            with self._lock:
                idle, dirty = self._active == 0, time.monotonic() < self._dirty_until
                if not dirty:
                    self._wake.clear()
            if idle:
                self._trim(0)
                self.trims += 1


MEDIA_MEMORY = MediaMemoryReleaser()
