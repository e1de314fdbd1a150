"""One server for the whole openai_server directory: launched once per pytest session (startup costs seconds on a
2-core machine), with the default model, an API key and metrics enabled."""

import openai
import pytest
import requests

from sglang.test.test_utils import DEFAULT_API_KEY_FOR_TEST, DEFAULT_SMALL_SERVER_ARGS, openai_client, popen_launch_server


@pytest.fixture(scope="session")
def server():
    srv = popen_launch_server(
        api_key=DEFAULT_API_KEY_FOR_TEST, other_args=[*DEFAULT_SMALL_SERVER_ARGS, "--enable-metrics"]
    )
    print(f"\nserver ready in {srv.startup_s:.1f} s at {srv.base_url}")
    yield srv
    srv.kill()


@pytest.fixture(scope="session")
def fp32_server():
    """A second server in float32, started only by the tests that compare outputs across batch compositions: in bf16
    the kernels for one row and for many rows round differently, so greedy text may part at a near-tie."""
    srv = popen_launch_server(other_args=[*DEFAULT_SMALL_SERVER_ARGS, "--dtype", "float32"])
    yield srv
    srv.kill()


@pytest.fixture(scope="session")
def base_url(server):
    return server.base_url


@pytest.fixture(scope="session")
def headers():
    return {"Authorization": f"Bearer {DEFAULT_API_KEY_FOR_TEST}"}


@pytest.fixture(scope="session")
def client(base_url):
    return openai_client(base_url, api_key=DEFAULT_API_KEY_FOR_TEST)


@pytest.fixture(scope="session")
def async_client(base_url):
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=DEFAULT_API_KEY_FOR_TEST, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model_info(base_url, headers):
    return requests.get(f"{base_url}/get_model_info", headers=headers, timeout=10).json()


@pytest.fixture(scope="session")
def model_name(model_info):
    return model_info["served_model_name"]


@pytest.fixture(scope="session")
def tokenizer(model_info):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_info["tokenizer_path"])
