"""`python -m sglang.launch_server [flags]`: upstream's classic entry point, same flags as `sglang serve`."""

import sys

if __name__ == "__main__":
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    print("Note: `sglang serve` is the recommended way to start the server.", file=sys.stderr)
    launch_server(prepare_server_args(sys.argv[1:]))
