"""SGLang-style serving runtime. Heavy imports (torch, the engine) are lazy so `import sglang` stays cheap."""

from sglang.version import __version__

__all__ = ["Engine", "__version__"]


def __getattr__(name):
    if name == "Engine":
        from sglang.srt.entrypoints.engine import Engine

        return Engine
    raise AttributeError(f"module 'sglang' has no attribute {name!r}")
