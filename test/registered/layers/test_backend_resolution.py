"""The attention backend is resolved once, by one function, for `sglang serve` and `sglang plan`: CUDA -> flashinfer
when installed, else triton; ROCm -> aiter when installed, else triton; CPU -> torch_native; a named backend wins
and one the platform cannot run is refused with the reason. The plan JSON and /server_info say which and why. An MLA
model (DeepSeek, Kimi-K2) defaults to triton on both GPU platforms: flashinfer's MLA wrapper runs only without CUDA
graphs and aiter's MLA is refused, so their defaults would be refused starts."""

import json
from pathlib import Path
from unittest import mock

import pytest

from sglang.cli import plan as plan_cli
from sglang.srt.layers.attention import backend_resolution as br
from sglang.srt.layers.attention.backend_resolution import resolve_attention_backend
from sglang.srt.mem_plan.gpu_presets import get_gpu_preset
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="cpu")


def installed(*modules):
    return lambda module: module in modules


def recording(calls):
    """The real resolve_attention_backend, noting each call's positional arguments in `calls`."""
    real = br.resolve_attention_backend

    def record(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    return record


@pytest.mark.parametrize("platform,libs,want", [
    ("cuda", ("flashinfer", "triton"), "flashinfer"),
    ("cuda", ("triton",), "triton"),
    ("rocm", ("aiter", "triton"), "aiter"),
    ("rocm", ("triton",), "triton"),
    ("cpu", ("flashinfer", "aiter", "triton"), "torch_native"),
])
def test_platform_defaults(platform, libs, want):
    choice = resolve_attention_backend(None, platform, installed(*libs))
    assert choice.name == want
    if want == "triton":  # the fallback names the missing library and how to get it
        vendor = {"cuda": "flashinfer", "rocm": "aiter"}[platform]
        assert f"{vendor}: the '{vendor}' package is not installed" in choice.reason
        assert f'pip install "sglang[{platform}]"' in choice.reason
    else:
        assert choice.reason == f"the {platform} default"


def test_named_backend_wins_or_is_refused():
    assert resolve_attention_backend("triton", "cuda", installed("flashinfer")).name == "triton"
    assert resolve_attention_backend("torch_native", "rocm").reason == "--attention-backend torch_native"
    for name, platform in (("flashinfer", "rocm"), ("aiter", "cuda"), ("flashinfer", "cpu"), ("aiter", "cpu")):
        with pytest.raises(ValueError, match=f"--attention-backend {name} cannot run on {platform}"):
            resolve_attention_backend(name, platform)
    with pytest.raises(ValueError, match="Unknown attention backend"):
        resolve_attention_backend("flash", "cuda")


@pytest.mark.parametrize("gpu,want", [("h100", "flashinfer"), ("mi300x", "aiter")])
def test_plan_resolves_through_the_servers_function(gpu, want):
    """`sglang plan --gpu X` asks the same function as the server, for a server installed with X's extra."""
    calls = []
    with mock.patch.object(br, "resolve_attention_backend", recording(calls)):
        status, result, text = plan_cli.run(["--gpu", gpu])
    preset = get_gpu_preset(gpu)
    assert status == 0 and calls == [(None, preset.platform)]
    assert result["attention_backend"] == want and "pip install" in result["attention_backend_reason"]
    assert f"attention {want} (the {preset.platform} default" in text
    # the server on that platform with the vendor library installed resolves the same
    assert resolve_attention_backend(None, preset.platform, installed(want, "triton")).name == want
    # the plan charges that backend's workspace (and graphs only where it has them)
    terms = {t["name"]: t for t in result["plan"]["terms"]}
    assert terms["attention_workspace"]["detail"].startswith(f"{want}: ")
    assert (result["plan"]["cuda_graph_max_bs"] > 0) == (want == "flashinfer")


def test_plan_refuses_a_backend_the_gpu_cannot_run(capsys):
    with pytest.raises(SystemExit):
        plan_cli.run(["--gpu", "mi300x", "--attention-backend", "flashinfer"])
    assert "flashinfer cannot run on rocm" in capsys.readouterr().err


def test_the_server_resolves_once_and_says_why():
    """A CPU start resolves through the same function and reports the choice in /server_info (Engine)."""
    import sglang

    calls = []
    with mock.patch.object(br, "resolve_attention_backend", recording(calls)):
        engine = sglang.Engine(log_level="warning", max_total_tokens=2048, max_running_requests=4)
    try:
        info = engine.get_server_info()
    finally:
        engine.shutdown()
    assert calls == [(None, "cpu")]
    assert info["attention_backend"] == {"name": "torch_native", "reason": "the cpu default"}
    json.dumps(info)


@pytest.mark.parametrize("platform", ["cuda", "rocm"])
def test_mla_models_default_to_triton_on_gpus(platform):
    choice = resolve_attention_backend(None, platform, installed("flashinfer", "aiter", "triton"), mla=True)
    assert choice.name == "triton" and "MLA" in choice.reason
    assert resolve_attention_backend("flashinfer" if platform == "cuda" else "aiter", platform, mla=True).reason \
        .startswith("--attention-backend")  # a named backend still wins (and is checked by the backend itself)
    assert resolve_attention_backend(None, "cpu", mla=True).name == "torch_native"


@pytest.mark.parametrize("gpu", ["h200", "mi300x"])
def test_plan_of_an_mla_model_charges_triton(gpu):
    """`sglang plan` resolves the MLA default as the runner does once it has read the config; a dense model keeps
    the vendor default (test_plan_resolves_through_the_servers_function)."""
    v3 = str(Path(__file__).resolve().parents[1] / "mem_plan" / "fixtures" / "deepseek-v3")
    status, result, _ = plan_cli.run(["--model-path", v3, "--gpu", gpu, "--tp", "8"])
    assert status == 0 and result["attention_backend"] == "triton"
    terms = {t["name"]: t for t in result["plan"]["terms"]}
    assert terms["attention_workspace"]["detail"].startswith("triton: ")
