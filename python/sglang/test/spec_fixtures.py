"""Helpers for speculative-decoding engine tests."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def spec_off(engine):
    """The engine decodes without speculation inside the block (its SpecDecoder swapped out; call while idle), so one
    engine gives both sides of a comparison."""
    s = engine.scheduler
    saved, s.runner.spec = s.runner.spec, None
    try:
        yield
    finally:
        s.runner.spec = saved
