"""`sglang serve --help` groups the flags under upstream's server_args section names; every ServerArgs field declares
one group; upstream's --max-payload-size (bytes) is this project's --max-request-body-mb, converted exactly; the
upstream flags --decode-log-interval and --enable-custom-logit-processor parse, and the latter's help says what it
trusts."""

import argparse
import dataclasses
import re
import shutil
import subprocess
import sys

import pytest

from sglang.srt.server_args import SERVER_ARGS_GROUPS, ServerArgs, prepare_server_args
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")

SGLANG = [shutil.which("sglang")] if shutil.which("sglang") else [sys.executable, "-m", "sglang.cli.main"]
# a few flags and the upstream section they sit in (upstream's docs/advanced_features/server_arguments.md)
UPSTREAM_PLACES = {
    "--model-path": "Model and tokenizer", "--port": "HTTP server", "--dtype": "Quantization and data type",
    "--mem-fraction-static": "Memory and scheduling", "--max-running-requests": "Memory and scheduling",
    "--tp-size": "Runtime options", "--random-seed": "Runtime options", "--log-level": "Logging",
    "--decode-log-interval": "Logging", "--enable-metrics": "Logging", "--api-key": "API related",
    "--served-model-name": "API related", "--tool-call-parser": "API related", "--dp-size": "Data parallelism",
    "--load-balance-method": "Data parallelism", "--nnodes": "Multi-node distributed serving",
    "--dist-init-addr": "Multi-node distributed serving", "--attention-backend": "Kernel backend",
    "--ep-size": "Expert parallelism", "--disable-radix-cache": "Optimization/debug options",
    "--enable-custom-logit-processor": "Optimization/debug options",
}


def flag(f: dataclasses.Field) -> str:
    return "--" + f.name.replace("_", "-")


def test_every_field_lands_in_exactly_one_group():
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    where = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            where.setdefault(action.dest, []).append(group.title)
    for f in dataclasses.fields(ServerArgs):
        assert f.metadata["group"] in SERVER_ARGS_GROUPS, f.name
        assert where.get(f.name) == [f.metadata["group"]], (f.name, where.get(f.name))
    used = {f.metadata["group"] for f in dataclasses.fields(ServerArgs)}
    assert used == set(SERVER_ARGS_GROUPS), "a group without flags would print an empty heading"


def test_serve_help_prints_the_groups_in_upstream_order():
    r = subprocess.run(SGLANG + ["serve", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    headings = re.findall(r"^(\S[^\n]*):$", r.stdout, flags=re.M)
    assert [h for h in headings if h in SERVER_ARGS_GROUPS] == list(SERVER_ARGS_GROUPS)
    # each flag printed under its heading: the text between the heading and the next one
    sections = dict(zip(headings, re.split(r"^\S[^\n]*:$", r.stdout, flags=re.M)[1:]))
    for name, group in UPSTREAM_PLACES.items():
        assert re.search(rf"^  {re.escape(name)}\b", sections[group], flags=re.M), (name, group)
        others = [g for g in SERVER_ARGS_GROUPS if g != group]
        assert not any(re.search(rf"^  {re.escape(name)}\b", sections[g], flags=re.M) for g in others), name


def test_max_payload_size_is_max_request_body_mb_in_bytes():
    assert ServerArgs().request_body_limit() == (32 << 20, "--max-request-body-mb")
    assert ServerArgs(max_request_body_mb=0.5).request_body_limit() == (1 << 19, "--max-request-body-mb")
    assert ServerArgs(max_payload_size=12345).request_body_limit() == (12345, "--max-payload-size")
    # both, agreeing: accepted
    assert ServerArgs(max_payload_size=2 << 20, max_request_body_mb=2.0).request_body_limit()[0] == 2 << 20
    with pytest.raises(ValueError, match=r"--max-payload-size 1000 .*--max-request-body-mb 2 "):
        ServerArgs(max_payload_size=1000, max_request_body_mb=2.0)
    with pytest.raises(ValueError, match="--max-payload-size must be a positive"):
        ServerArgs(max_payload_size=0)
    assert prepare_server_args(["--max-payload-size", "4096"]).request_body_limit() == (4096, "--max-payload-size")


def test_conflicting_body_limits_fail_at_launch_naming_both():
    r = subprocess.run(SGLANG + ["serve", "--max-payload-size", "1000", "--max-request-body-mb", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--max-payload-size" in r.stderr and "--max-request-body-mb" in r.stderr, r.stderr


def test_upstream_logging_and_processor_flags():
    assert ServerArgs().decode_log_interval == 40  # upstream's default
    assert prepare_server_args(["--decode-log-interval", "7"]).decode_log_interval == 7
    with pytest.raises(ValueError, match="--decode-log-interval"):
        ServerArgs(decode_log_interval=0)
    assert prepare_server_args(["--enable-custom-logit-processor"]).enable_custom_logit_processor
    assert not ServerArgs().enable_custom_logit_processor
    help_text = {f.name: f.metadata["help"] for f in dataclasses.fields(ServerArgs)}
    assert "arbitrary Python" in help_text["enable_custom_logit_processor"]
    assert "shell access" in help_text["enable_custom_logit_processor"]
    served = help_text["served_model_name"]
    assert "defaults to --model-path as given" in served and "not checked" in served


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
