"""The `sglang` console script.

    sglang serve [flags]     start the HTTP server (flags are generated from ServerArgs; see `sglang serve --help`)
    sglang version           print the version
    sglang plan [flags]      print the memory plan for a configuration without serving
"""

from __future__ import annotations

import sys
from typing import List, Optional

USAGE = """usage: sglang <command> [flags]

commands:
  serve     Start the OpenAI-compatible HTTP server (default model: the bundled SmolLM2-135M-Instruct).
  version   Print the version.
  plan      Print the memory plan for a configuration without serving.

Run `sglang <command> --help` for the flags of a command.
"""


def serve(argv: List[str]) -> int:
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    launch_server(prepare_server_args(argv))
    return 0


def version(argv: List[str]) -> int:
    from sglang.version import __version__

    print(__version__)
    return 0


def plan(argv: List[str]) -> int:
    from sglang.cli.plan import main as plan_main

    return plan_main(argv) or 0


COMMANDS = {"serve": serve, "version": version, "plan": plan}


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    if argv[0] in ("-V", "--version"):
        return version([])
    command = COMMANDS.get(argv[0])
    if command is None:
        print(f"sglang: unknown command {argv[0]!r}\n\n{USAGE}", end="", file=sys.stderr)
        return 2
    return command(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
