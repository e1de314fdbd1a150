"""schemathesis against the served /openapi.json (positive and negative bodies for every operation): no 5xx, no
dropped connection, and the server is intact afterwards. A short run of scripts/fuzz_openapi.py; the full run
(>= 2,000 cases) is `python scripts/fuzz_openapi.py --max-examples 60`."""

import importlib.util
import os
import sys

import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import popen_launch_server

register_cpu_ci(est_time=40, suite="cpu")

pytest.importorskip("schemathesis")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def load_fuzz_script():
    spec = importlib.util.spec_from_file_location("fuzz_openapi", os.path.join(REPO, "scripts", "fuzz_openapi.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fuzz_module():
    return load_fuzz_script()


@pytest.fixture(scope="module")
def small_server(fuzz_module):
    srv = popen_launch_server(api_key="fuzz-key", other_args=fuzz_module.DEFAULT_SERVER_ARGS)
    yield srv
    srv.kill()


def test_schemathesis_finds_no_5xx(fuzz_module, small_server):
    result = fuzz_module.fuzz(small_server.base_url, "fuzz-key", max_examples=8, seed=0)
    print(result.report())
    assert result.cases >= 150
    assert result.num_5xx == 0 and not result.transport_errors, result.report()
    assert result.status_counts[200] > 0 and result.status_counts[400] > 0  # both valid and invalid bodies reached
    # every documented body was exercised in both modes
    for path in ("/v1/chat/completions", "/v1/completions", "/generate", "/v1/tokenize", "/v1/detokenize",
                 "/v1/responses", "/v1/embeddings", "/v1/score"):
        for mode in ("positive", "negative"):
            assert result.per_operation[f"POST {path} [{mode}]"] > 0
    headers = {"Authorization": "Bearer fuzz-key"}
    info = requests.get(f"{small_server.base_url}/server_info", headers=headers, timeout=30).json()
    assert info["memory_integrity"] == "ok" and info["internal_states"][0]["num_used_tokens"] == 0


def test_fuzz_counts_5xx(fuzz_module, small_server, monkeypatch):
    """The harness itself can fail: a 5xx answer is counted and reproduced (a fake 503 on one operation)."""
    import schemathesis.generation.case as case_mod

    real_call = case_mod.Case.call

    def call(self, *args, **kwargs):
        resp = real_call(self, *args, **kwargs)
        if self.operation.path == "/v1/tokenize":
            resp.status_code = 503
        return resp

    monkeypatch.setattr(case_mod.Case, "call", call)
    result = fuzz_module.fuzz(small_server.base_url, "fuzz-key", max_examples=2, seed=0, modes=("positive",),
                              operations=["/v1/tokenize"])
    assert result.num_5xx == result.cases > 0 and "curl" in result.errors_5xx[0]
