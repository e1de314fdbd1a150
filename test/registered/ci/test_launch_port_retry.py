"""popen_launch_server on a port it chose itself: the port is free when chosen, not held, so a test group running
side by side (run_suite --jobs) can bind it first. The server then exits naming the taken address, and the launch
is tried again on a new port; a port the caller named is never swapped for another."""

import socket
import sys
import textwrap

import pytest

from sglang.test import test_utils
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

# a stand-in server with the real one's bind check (the launch's port-retry logic is what is tested here)
STANDIN = textwrap.dedent("""
    import http.server, sys
    from sglang.srt.entrypoints.server_lifecycle import check_port_free
    port = int(sys.argv[sys.argv.index("--port") + 1])
    check_port_free("127.0.0.1", port)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
    """)


@pytest.fixture
def taken_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_the_real_server_names_a_taken_port_in_the_text_the_launch_looks_for(taken_port):
    with pytest.raises(RuntimeError) as e:
        test_utils.popen_launch_server(base_url=f"http://127.0.0.1:{taken_port}", timeout=120)
    assert test_utils.PORT_TAKEN_TEXT in str(e.value).lower(), str(e.value)


def test_a_port_taken_before_the_server_binds_it_is_replaced(monkeypatch, taken_port):
    free = test_utils.find_free_port
    handed = iter([taken_port, taken_port])  # the first two choices lose the race, the third does not
    monkeypatch.setattr(test_utils, "find_free_port", lambda host="127.0.0.1": next(handed, None) or free(host))
    server = test_utils.popen_launch_server(command=[sys.executable, "-c", STANDIN], timeout=60)
    try:
        port = int(server.base_url.rsplit(":", 1)[1])
        assert port != taken_port and server.poll() is None
    finally:
        server.kill()


def test_a_port_the_caller_named_is_not_replaced(monkeypatch, taken_port):
    monkeypatch.setattr(test_utils, "find_free_port", lambda host="127.0.0.1": pytest.fail("no new port is chosen"))
    with pytest.raises(RuntimeError, match="(?i)address already in use"):
        test_utils.popen_launch_server(base_url=f"http://127.0.0.1:{taken_port}",
                                       command=[sys.executable, "-c", STANDIN], timeout=60)


def test_a_port_lost_every_time_gives_up_saying_so(monkeypatch, taken_port):
    monkeypatch.setattr(test_utils, "find_free_port", lambda host="127.0.0.1": taken_port)
    with pytest.raises(RuntimeError, match="No free port"):
        test_utils.popen_launch_server(command=[sys.executable, "-c", STANDIN], timeout=60)
