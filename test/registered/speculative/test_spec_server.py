"""A server with --speculative-algorithm NGRAM, through the real HTTP server and the `openai` client: greedy chat and
completions, streamed and not, on prompts whose answers repeat their own text, equal the default model's greedy
tokens without speculation (an in-process Engine without speculative flags, run first in this module); the proposals
really ran (/generate's meta_info spec_verify_ct > 0 and spec_accept_length > 1, /server_info's "speculative"
counters > 1 token per verify, and /metrics' sglang:spec_accept_length gauge, read while that request runs, > 1 in at
least one window between the scheduler's pushes); a contradictory --speculative-*
combination stops the launcher with exit status 2 naming the flag.

Then a small server runs STANDALONE (a random 2-layer Llama target in fp32 with a random 1-layer Llama draft, the
default model's tokenizer), after it one runs EAGLE3 over the same target (a random head in the published layout,
sglang.test.eagle_heads), then STANDALONE as a tree (--speculative-eagle-topk 2): /generate, chat and a streamed
completion through the `openai` client equal an in-process Engine's greedy output of the target without
speculation, /generate's meta_info spec_verify_ct > 0, and /server_info names the algorithm and top-k and holds the
draft's plan terms (draft_weights, draft_kv_cache, no draft_cuda_graphs, the logits and hidden-state rows) and the
verify rows a request takes (a tree's expanded: 2 x (3 + 1) = 8 for num_draft_tokens 7) equal to what
`sglang plan --json` with the same flags prices."""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import openai_client, popen_launch_server

register_cpu_ci(est_time=190, suite="cpu")

MAX_TOKENS = 48
PASSAGE = ("The lighthouse stood at the end of the rocky point. Every evening the keeper climbed the steps, "
           "polished the great lens and lit the lamp, and ships far out at sea saw the beam sweep across the water.")
CHAT = [{"role": "user", "content": f"Quote the following paragraph word for word.\n\n{PASSAGE}"}]
# a completion whose greedy continuation repeats the pattern above it
CODE = "".join(f"def add_{n}(x):\n    return x + {n}\n\n" for n in range(1, 6)) + "def add_6(x):\n"


@pytest.fixture(scope="module")
def reference():
    """Greedy text without speculation: the chat prompt rendered by the model's template, as the server does."""
    from sglang import Engine

    engine = Engine()
    try:
        chat_prompt = engine.request_tokenizer.tokenizer.apply_chat_template(CHAT, tokenize=False,
                                                                              add_generation_prompt=True)
        sp = {"temperature": 0.0, "max_new_tokens": MAX_TOKENS}
        return {"code": engine.generate(CODE, sp), "chat": engine.generate(chat_prompt, sp)}
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def server(reference):
    srv = popen_launch_server(other_args=["--speculative-algorithm", "NGRAM", "--enable-metrics"])
    try:
        yield srv
    finally:
        srv.kill()


def test_greedy_equals_non_speculative_and_proposals_pay(server, reference):
    url, client = server.base_url, openai_client(server.base_url)
    model = client.models.list().data[0].id
    code, chat = reference["code"], reference["chat"]

    # the gauge is the accept length over the verify steps between two of the scheduler's stats pushes (every 0.5 s
    # while busy, once when idle): read it while this request, the only one in flight, runs and until it settles
    gauges, done = [], threading.Event()
    watcher = threading.Thread(target=_watch_gauge, args=(url, gauges, done))
    watcher.start()
    before = requests.get(f"{url}/server_info", timeout=30).json()["stats"]
    r = requests.post(f"{url}/generate", json={"text": CODE, "sampling_params": {
        "temperature": 0.0, "max_new_tokens": MAX_TOKENS}}, timeout=120).json()
    after = requests.get(f"{url}/server_info", timeout=30).json()["stats"]
    assert r["output_ids"] == code["output_ids"]
    meta = r["meta_info"]
    # the only request in flight: its own counts are the server's counters' movement
    steps = after["spec_req_steps"] - before["spec_req_steps"]
    assert meta["spec_verify_ct"] == steps > 0, (meta, before, after)
    assert meta["spec_accept_length"] == (after["spec_committed_tokens"] - before["spec_committed_tokens"]) / steps
    # tokens committed per verify step: > 1 means proposals were accepted; decode steps without proposals are not
    # verify steps, so spec_verify_ct < completion_tokens
    assert 1 < meta["spec_accept_length"] <= 8 and meta["spec_verify_ct"] < meta["completion_tokens"], meta
    done.set()
    watcher.join()
    # the windows between pushes partition this request's verify steps, which averaged > 1 token a step: at least one
    # window's value is > 1, and none is outside [1, the most a step commits]
    assert gauges and max(gauges) > 1 and all(1 <= g <= 8 for g in gauges), gauges

    out = client.completions.create(model=model, prompt=CODE, max_tokens=MAX_TOKENS, temperature=0)
    assert out.choices[0].text == code["text"]
    assert out.usage.completion_tokens == code["meta_info"]["completion_tokens"]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt=CODE, max_tokens=MAX_TOKENS, temperature=0, stream=True) if c.choices)
    assert streamed == code["text"]

    out = client.chat.completions.create(model=model, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0)
    assert out.usage.prompt_tokens == chat["meta_info"]["prompt_tokens"]  # the reference saw the same prompt
    assert out.choices[0].message.content == chat["text"]
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0, stream=True) if c.choices)
    assert streamed == chat["text"]

    spec = requests.get(f"{url}/server_info", timeout=30).json()["speculative"]
    assert spec["algorithm"] == "NGRAM" and spec["num_draft_tokens"] >= 2, spec
    assert spec["verify_steps"] > 0 and 0 < spec["accepted_tokens"] <= spec["proposed_tokens"], spec
    assert spec["accept_length"] > 1, spec


def _watch_gauge(url: str, gauges: list, done: threading.Event) -> None:
    """Every distinct nonzero value sglang:spec_accept_length takes, until `done` and then 3 s without a change
    (the idle push comes within 0.5 s of the last step)."""
    settled_at = None
    while True:
        text = requests.get(f"{url}/metrics", timeout=30).text
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        assert fams["sglang:spec_accept_length"].type == "gauge"
        value = fams["sglang:spec_accept_length"].samples[0].value
        if value > 0 and (not gauges or gauges[-1] != value):
            gauges.append(value)
            settled_at = None
        if done.is_set():
            settled_at = settled_at or time.monotonic()
            if time.monotonic() - settled_at > 3:
                return
        time.sleep(0.05)


@pytest.mark.parametrize("flags, named", [
    (["--speculative-num-steps", "3"], "--speculative-num-steps"),  # without an algorithm it does nothing
    (["--speculative-algorithm", "NGRAM", "--speculative-eagle-topk", "4"], "--speculative-eagle-topk"),  # a tree
])
def test_contradictory_flags_stop_the_launcher(flags, named):
    out = subprocess.run([sys.executable, "-m", "sglang.launch_server", *flags], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and named in out.stderr, (out.returncode, out.stderr[-2000:])


def random_llama(path: str, layers: int, seed: int, tok) -> str:
    """A random-weight Llama with `tok`'s vocabulary (rounded up to 64) and tokenizer files, saved in HF layout."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=(len(tok) + 63) // 64 * 64, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=None,
                      bos_token_id=tok.bos_token_id, initializer_range=0.3)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


STANDALONE_NEW = 24
STANDALONE_TOKENS = 2048  # a fixed pool, so a start and the dry run hold the same number of draft KV rows


@pytest.fixture(scope="module", params=["STANDALONE", "EAGLE3", "STANDALONE-topk2"])
def standalone(request):
    """A random target and draft (STANDALONE: a 1-layer Llama, as a chain and as a tree of top-k 2; EAGLE3: a random
    head reading layers 0, 1, 1 of the 2-layer target), the target's greedy text without speculation (an in-process
    Engine), and a server with that algorithm over them (one at a time)."""
    from transformers import AutoTokenizer

    from sglang import Engine
    from sglang.test.eagle_heads import make_eagle3_head
    from sglang.test.engine_fixtures import default_model_dir, shutdown

    tmp = tempfile.TemporaryDirectory()
    tok = AutoTokenizer.from_pretrained(default_model_dir())
    target = random_llama(os.path.join(tmp.name, "target"), 2, 0, tok)
    algorithm, _, tree = request.param.partition("-topk")
    if algorithm == "EAGLE3":
        draft = make_eagle3_head(os.path.join(tmp.name, "head"), target, seed=1, aux_layer_ids=[0, 1, 1])
    else:
        draft = random_llama(os.path.join(tmp.name, "draft"), 1, 1, tok)
    flags = ["--dtype", "float32", "--max-total-tokens", str(STANDALONE_TOKENS), "--speculative-algorithm",
             algorithm, "--speculative-draft-model-path", draft] + (["--speculative-eagle-topk", tree] if tree else [])
    engine = Engine(model_path=target, dtype="float32", max_total_tokens=STANDALONE_TOKENS, log_level="warning")
    try:
        chat_prompt = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        sp = {"temperature": 0.0, "max_new_tokens": STANDALONE_NEW, "ignore_eos": True}
        ref = {"code": engine.generate(CODE, sp), "chat": engine.generate(chat_prompt, sp)}
    finally:
        shutdown(engine)
    srv = popen_launch_server(model=target, other_args=flags)
    try:
        yield dict(server=srv, ref=ref, target=target, flags=flags, algorithm=algorithm, topk=int(tree or 1))
    finally:
        srv.kill()
        tmp.cleanup()


def test_standalone_over_http(standalone):
    url, ref = standalone["server"].base_url, standalone["ref"]
    client = openai_client(url)
    model = client.models.list().data[0].id
    extra = {"ignore_eos": True}

    r = requests.post(f"{url}/generate", json={"text": CODE, "sampling_params": {
        "temperature": 0.0, "max_new_tokens": STANDALONE_NEW, "ignore_eos": True}}, timeout=120).json()
    assert r["output_ids"] == ref["code"]["output_ids"]
    assert r["meta_info"]["spec_verify_ct"] > 0, r["meta_info"]  # the draft proposed, the target verified

    out = client.chat.completions.create(model=model, messages=CHAT, max_tokens=STANDALONE_NEW, temperature=0,
                                         extra_body=extra)
    assert out.usage.prompt_tokens == ref["chat"]["meta_info"]["prompt_tokens"]
    assert out.choices[0].message.content == ref["chat"]["text"]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt=CODE, max_tokens=STANDALONE_NEW, temperature=0, stream=True, extra_body=extra)
        if c.choices)
    assert streamed == ref["code"]["text"]

    info = requests.get(f"{url}/server_info", timeout=30).json()
    spec = info["speculative"]
    assert spec["algorithm"] == standalone["algorithm"] and spec["verify_steps"] > 0 and spec["proposed_tokens"] > 0, spec
    assert spec["eagle_topk"] == standalone["topk"], spec
    served = {t["name"]: t["num_bytes"] for t in info["memory_plan"]["terms"]}

    dry = subprocess.run(["sglang", "plan", "--model-path", standalone["target"], "--device", "cpu",
                          *standalone["flags"], "--json"], capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr[-2000:]
    dry_plan = json.loads(dry.stdout)["plan"]
    planned = {t["name"]: t["num_bytes"] for t in dry_plan["terms"]}
    for name in ("draft_weights", "draft_kv_cache", "draft_cuda_graphs", "logits", "spec_hidden_states"):
        assert served[name] == planned[name], (name, served[name], planned[name])
    # the verify rows a request takes: a chain's num_draft_tokens (3 steps + 1), a tree's 2 branches x (3 + 1)
    got, want = info["memory_plan"]["speculative"], dry_plan["speculative"]
    keys = ("num_draft_tokens", "verify_rows_per_req", "verify_tokens")
    assert [got[k] for k in keys] == [want[k] for k in keys], (got, want)
    assert (got["num_draft_tokens"], got["verify_rows_per_req"]) == ((7, 8) if standalone["topk"] == 2 else (4, 4))
    # 1 draft (head) layer x 2 KV heads x 16 dims, K and V, fp32, over the pool's tokens and its dummy page
    page = info["memory_plan"]["page_size"]
    assert served["draft_kv_cache"] == 256 * (STANDALONE_TOKENS + page) and served["draft_weights"] > 0

