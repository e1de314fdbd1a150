"""Which installed pytest plugins a group of test files loads.

A group's pytest loads only the installed pytest plugins (pytest11 entry points) that one of its files names (the
plugin's entry-point or distribution name anywhere in the file's text): hypothesis' and schemathesis' plugins import
those libraries, ~5 s per process that every group would pay otherwise.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parent.parent


def installed_plugins() -> List[tuple]:
    """(entry-point name, the names a test file that uses it would contain) of each auto-loaded pytest plugin."""
    out = []
    for ep in importlib.metadata.entry_points(group="pytest11"):
        dist = (ep.dist.name if ep.dist else "").lower()
        out.append((ep.name, {n for n in (ep.name, dist, dist.replace("-", "_")) if n}))
    return out


def plugin_blocks(files: List[str], plugins: List[tuple]) -> List[str]:
    """`-p no:NAME` for each plugin that none of `files` names; a plugin named anywhere in a file stays loaded."""
    texts = [(ROOT / f).read_text().lower() for f in files]
    out = []
    for name, words in plugins:
        if not any(w.lower() in t for w in words for t in texts):
            out += ["-p", f"no:{name}"]
    return out
