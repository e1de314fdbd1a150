"""How long this process has existed: the start of a startup breakdown (the interpreter's start and imports)."""

from __future__ import annotations

import time


def process_age_s() -> float:
    """Seconds since this process was created (0.0 where psutil cannot tell)."""
    try:
        import psutil

        return max(time.time() - psutil.Process().create_time(), 0.0)
    except Exception:  # noqa: BLE001 - only log lines depend on it
        return 0.0
