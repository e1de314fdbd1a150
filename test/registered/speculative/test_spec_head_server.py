"""Hidden-state heads as trees, and with a target sharded over two ranks, through the real HTTP server and the
`openai` client (issue 44: every speculative feature end to end through the server, not only sglang.Engine).

Three servers, one after the other, fp32, the default model's tokenizer, --speculative-eagle-topk 2 (3 steps):
  * EAGLE3 at --tp-size 1 and 2: pairing_target (a 2-layer Llama whose text alternates two tokens, and whose
    output jumps elsewhere wherever an absent token's KV is in its context) with copying_eagle3_head (published
    layout, sglang.test.eagle_heads; first choice always the absent token, second always right): every tree step
    commits through branch 1 (a chain would commit no draft token), so a step that leaves the rejected branch's KV
    at a committed position changes the tokens;
  * NEXTN at --tp-size 2: a DeepSeek-V3 (MLA, routed + shared experts) whose MTP layer copies its target
    (test_spec_nextn_engine.copying_checkpoint): most proposals accepted, the head on rank 0 alone.
For each: /generate, a chat completion and a streamed text completion equal an in-process Engine's greedy output of
the same target without speculation (same --tp-size); a chat completion with response_format json_schema (24 digits
and an enum) and /generate with the same json_schema equal the Engine's output under that schema and parse under it
(EAGLE3: more than one token per verify step under the grammar); /generate's meta_info spec_verify_ct > 0 and
spec_accept_length > 1; /server_info names the algorithm, the top-k and the tp size, counts no fault (a verify step
that fell back), and its plan's draft terms (draft_weights, draft_kv_cache, draft_cuda_graphs, logits,
spec_hidden_states; at tp 2 "TP rank 0 alone") and the verify rows a request takes (num_draft_tokens 7,
2 x (3 + 1) = 8 rows) equal `sglang plan --json` with its flags."""

import json
import os
import subprocess
import tempfile

import pytest
import requests
import torch

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import openai_client, popen_launch_server

register_cpu_ci(est_time=90, suite="cpu")

NEW_TOKENS = 24
JSON_TOKENS = 64
POOL_TOKENS = 2048  # a fixed pool, so the start and the dry run hold the same number of draft KV rows
CHAT = [{"role": "user", "content": "Quote this line word for word: the lighthouse keeper lit the lamp at dusk."}]
JSON_CHAT = [{"role": "user", "content": "Give a color as JSON."}]
CODE = "".join(f"def add_{n}(x):\n    return x + {n}\n\n" for n in range(1, 4)) + "def add_4(x):\n"
# 24 digits: pairing_target alternates two digit tokens there (the digits' ids pair up), so the copying EAGLE3 head's
# proposals are accepted under the grammar, and the 25th must be the closing quote the grammar forces
SCHEMA = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[0-9]{24}$"},
                                           "color": {"enum": ["red", "green", "blue"]}},
          "required": ["code", "color"], "additionalProperties": False}
CASES = {  # name: (algorithm, tp size, whether the JSON request must accept draft tokens)
    "EAGLE3-topk2": ("EAGLE3", 1, True),
    "EAGLE3-topk2-tp2": ("EAGLE3", 2, True),
    "NEXTN-topk2-tp2": ("NEXTN", 2, False),  # the MTP layer copies the target's unmasked choice: rarely a digit
}


SHARED = 0.3  # every embedding row's value in dimension 0 (dimension 1 is the absent token's alone)
GAIN = 100  # pairing_target's layer-1 attention output per unit of the absent token's normed value
MLP_STEP = 0.04  # copying_eagle3_head's MLP: what it adds to dimension 0 per unit of silu(d0) x d0


class _OneMore:
    """`tok` as eagle_heads.make_llama_target reads it, one token longer: the vocabulary, rounded up to 64, then has
    ids beyond the tokenizer's."""

    def __init__(self, tok):
        self.tok, self.eos_token_id, self.bos_token_id = tok, tok.eos_token_id, tok.bos_token_id

    def __len__(self):
        return len(self.tok) + 1

    def save_pretrained(self, path):
        self.tok.save_pretrained(path)


def pairing_target(path: str, tok) -> str:
    """A 2-layer Llama whose greedy next token is its last token's partner (ids 2i and 2i + 1 pair up), so its text
    alternates two tokens, unless the absent token (the last id: no text, never generated) sits in its context.
    The embedding's rows are unit-norm with SHARED in dimension 0 and nothing in dimension 1, but the absent token's,
    which is dimension 1's unit vector; every norm's weight is one; lm_head row t is the embedding of t's partner.
    Both layers' attention outputs and MLPs add nothing but layer 1's attention: its scores are all zero (attention
    is the mean over the context) and its values read dimension 1 alone, so where the absent token's KV is in the
    context the output moves by GAIN x 8 x its share toward another token -- as it is where a tree step commits
    through a side branch and the rejected branch's KV stays at a committed position."""
    from safetensors.torch import load_file, save_file

    from sglang.test.eagle_heads import make_llama_target

    make_llama_target(path, _OneMore(tok), layers=2)
    file = os.path.join(path, "model.safetensors")
    w = load_file(file)
    V, H = w["model.embed_tokens.weight"].shape
    absent = V - 1
    assert len(tok) < absent, (len(tok), V)  # the absent token is no text
    g = torch.Generator().manual_seed(2)
    rows = torch.randn(V, H, generator=g)
    rows[:, :2] = 0
    embed = torch.nn.functional.normalize(rows, dim=-1) * (1 - SHARED ** 2) ** 0.5
    embed[:, 0] = SHARED
    embed[absent] = 0
    embed[absent, 1] = 1
    for k in w:
        if k.endswith("o_proj.weight") or k.endswith("down_proj.weight") or k.endswith("k_proj.weight"):
            w[k] = torch.zeros_like(w[k])
        elif k.endswith("norm.weight"):
            w[k] = torch.ones_like(w[k])
    w["model.embed_tokens.weight"] = embed
    w["lm_head.weight"] = embed[torch.arange(V) ^ 1].clone()
    v = torch.zeros_like(w["model.layers.1.self_attn.v_proj.weight"])
    v[0, 1] = 1  # KV head 0's first value dimension := the input's dimension 1 (normed: 8 for the absent token)
    o = torch.zeros_like(w["model.layers.1.self_attn.o_proj.weight"])
    o[:, 0] = GAIN * embed[2]  # query head 0's first dimension -> toward token 2 (so the next token becomes 3)
    w["model.layers.1.self_attn.v_proj.weight"], w["model.layers.1.self_attn.o_proj.weight"] = v, o
    save_file(w, file, metadata={"format": "pt"})
    return path


def copying_eagle3_head(path: str, target: str) -> str:
    """An EAGLE-3 head (full draft vocabulary, d2t zero) whose first choice at row q is always the absent token
    (wrong) and its second the token at q, which over pairing_target's alternating text is the token at q + 2: every
    tree step over that text commits its first draft token through branch 1, a chain never commits a draft token.
    fc passes the first auxiliary layer's residual stream (the token's embedding), the midlayer's attention adds
    nothing (o_proj zero) and its MLP only a little to dimension 0, the final norm's weight is one, lm_head is the
    target's embedding but the absent token's row, 5 x dimension 0's unit vector (at the first step a logit lead of
    ~11 over the token's own, larger at each later step)."""
    from safetensors.torch import load_file, save_file

    from sglang.test.eagle_heads import make_eagle3_head

    with open(os.path.join(target, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    make_eagle3_head(path, target, seed=1, draft_vocab_size=vocab, aux_layer_ids=[0, 1, 1])
    file = os.path.join(path, "model.safetensors")
    w, embed = load_file(file), load_file(os.path.join(target, "model.safetensors"))["model.embed_tokens.weight"]
    H = embed.shape[1]
    w["fc.weight"] = torch.cat([torch.eye(H), torch.zeros(H, 2 * H)], 1)
    w["midlayer.self_attn.o_proj.weight"] = torch.zeros_like(w["midlayer.self_attn.o_proj.weight"])
    # the MLP adds MLP_STEP x silu(d0) x d0 to dimension 0 (d0: the normed input's dimension 0, ~2.4 at the first
    # step), and the sum carries into the next step: the absent token's lead grows with depth, so the tree's second
    # branch takes the right token at depth 1 rather than a runner-up deeper down (no tie between them)
    for k, value in (("gate_proj", 1.0), ("up_proj", 1.0), ("down_proj", MLP_STEP)):
        w[f"midlayer.mlp.{k}.weight"] = torch.zeros_like(w[f"midlayer.mlp.{k}.weight"])
        w[f"midlayer.mlp.{k}.weight"][0, 0] = value
    w["midlayer.post_attention_layernorm.weight"] = torch.ones_like(w["midlayer.post_attention_layernorm.weight"])
    head = embed.clone()
    head[-1] = 0
    head[-1, 0] = 5
    w["norm.weight"], w["lm_head.weight"] = torch.ones_like(w["norm.weight"]), head
    assert not w["d2t"].any()  # every target id is its own draft id
    save_file(w, file, metadata={"format": "pt"})
    return path


def checkpoints(name: str, root: str, tok):
    """(target path, draft path or None: NEXTN's head is the target checkpoint's MTP layer). Both targets stop on the
    tokenizer's EOS, so a grammar can end its object."""
    if CASES[name][0] == "EAGLE3":
        target = pairing_target(os.path.join(root, "target"), tok)
        return target, copying_eagle3_head(os.path.join(root, "head"), target)
    from test_spec_nextn_engine import copying_checkpoint

    target = copying_checkpoint(os.path.join(root, "v3"), tok)
    with open(os.path.join(target, "config.json")) as f:
        config = json.load(f)
    config["eos_token_id"] = tok.eos_token_id
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(config, f)
    return target, None


def json_params() -> dict:
    return {"temperature": 0.0, "max_new_tokens": JSON_TOKENS, "json_schema": json.dumps(SCHEMA)}


@pytest.fixture(scope="module", params=list(CASES))
def served(request):
    """The checkpoints, the target's greedy outputs without speculation (an in-process Engine of the same tp size),
    and a server with the case's speculative flags over them."""
    from transformers import AutoTokenizer

    from sglang import Engine
    from sglang.test.engine_fixtures import default_model_dir, shutdown

    algorithm, tp, json_accepts = CASES[request.param]
    tmp = tempfile.TemporaryDirectory()
    tok = AutoTokenizer.from_pretrained(default_model_dir())
    target, draft = checkpoints(request.param, tmp.name, tok)
    base = ["--dtype", "float32", "--max-total-tokens", str(POOL_TOKENS), "--tp-size", str(tp)]
    flags = base + ["--speculative-algorithm", algorithm, "--speculative-eagle-topk", "2",
                    "--speculative-num-steps", "3"]
    if draft:
        flags += ["--speculative-draft-model-path", draft]
    engine = Engine(model_path=target, dtype="float32", max_total_tokens=POOL_TOKENS, tp_size=tp, log_level="warning")
    try:
        render = lambda msgs: tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)  # noqa: E731
        sp = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
        ref = {"code": engine.generate(CODE, sp), "chat": engine.generate(render(CHAT), sp),
               "json_prompt": render(JSON_CHAT)}
        ref["json"] = engine.generate(ref["json_prompt"], json_params())
    finally:
        shutdown(engine)
    srv = popen_launch_server(model=target, other_args=flags)
    try:
        yield dict(server=srv, ref=ref, target=target, flags=flags, algorithm=algorithm, tp=tp,
                   json_accepts=json_accepts)
    finally:
        srv.kill()
        tmp.cleanup()


def test_tree_over_http_equals_decoding_without_speculation(served):
    import jsonschema

    url, ref = served["server"].base_url, served["ref"]
    client = openai_client(url)
    model = client.models.list().data[0].id
    extra = {"ignore_eos": True}

    r = requests.post(f"{url}/generate", json={"text": CODE, "sampling_params": {
        "temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}}, timeout=120).json()
    assert r["output_ids"] == ref["code"]["output_ids"]
    # the head proposed trees, the target verified them and accepted some of their tokens
    assert r["meta_info"]["spec_verify_ct"] > 0 and r["meta_info"]["spec_accept_length"] > 1, r["meta_info"]

    out = client.chat.completions.create(model=model, messages=CHAT, max_tokens=NEW_TOKENS, temperature=0,
                                         extra_body=extra)
    assert out.usage.prompt_tokens == ref["chat"]["meta_info"]["prompt_tokens"]  # the same rendered prompt
    assert out.choices[0].message.content == ref["chat"]["text"]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt=CODE, max_tokens=NEW_TOKENS, temperature=0, stream=True, extra_body=extra) if c.choices)
    assert streamed == ref["code"]["text"]

    # the grammar masks every verified row of the tree; what is committed is what decoding without speculation
    # under the same schema commits, and it is a finished JSON object
    out = client.chat.completions.create(model=model, messages=JSON_CHAT, max_tokens=JSON_TOKENS, temperature=0,
                                         response_format={"type": "json_schema", "json_schema": {
                                             "name": "color", "schema": SCHEMA, "strict": True}})
    assert out.choices[0].message.content == ref["json"]["text"]
    assert out.choices[0].finish_reason == "stop", out.choices[0]
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    # and through /generate's json_schema: over the digits a step commits a draft token and the next row's token
    # (sampled under the grammar as advanced by the first), so more than one token per verify step
    r = requests.post(f"{url}/generate", json={"text": ref["json_prompt"], "sampling_params": json_params()},
                      timeout=120).json()
    assert r["output_ids"] == ref["json"]["output_ids"]
    assert r["meta_info"]["spec_accept_length"] > 1 or not served["json_accepts"], r["meta_info"]

    info = requests.get(f"{url}/server_info", timeout=30).json()
    spec = info["speculative"]
    assert spec["algorithm"] == served["algorithm"] and spec["eagle_topk"] == 2, spec
    assert spec["verify_steps"] > 0 and 0 < spec["accepted_tokens"] <= spec["proposed_tokens"], spec
    assert info["tp_size"] == served["tp"], info["tp_size"]
    # no step fell back to a decode (a fault in a verify step is confined, and the decode's tokens would match)
    assert info["stats"]["num_faults"] == 0 and info["stats"]["num_failed_reqs"] == 0, info["stats"]
    terms = {t["name"]: t for t in info["memory_plan"]["terms"]}
    served_terms = {name: t["num_bytes"] for name, t in terms.items()}

    dry = subprocess.run(["sglang", "plan", "--model-path", served["target"], "--device", "cpu", *served["flags"],
                          "--json"], capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr[-2000:]
    dry_plan = json.loads(dry.stdout)["plan"]
    planned = {t["name"]: t["num_bytes"] for t in dry_plan["terms"]}
    for name in ("draft_weights", "draft_kv_cache", "draft_cuda_graphs", "logits", "spec_hidden_states"):
        assert served_terms[name] == planned[name], (name, served_terms[name], planned[name])
    assert served_terms["draft_weights"] > 0 and served_terms["draft_kv_cache"] > 0
    for name in ("draft_weights", "draft_kv_cache"):  # at tp 2 the draft is rank 0's, unsharded
        assert ("TP rank 0 alone" in terms[name]["detail"]) == (served["tp"] > 1), terms[name]
    # a top-k 2 tree of 3 steps: 2 x 3 + 1 draft tokens, verified as 2 branches x (3 + 1) rows
    got, want = info["memory_plan"]["speculative"], dry_plan["speculative"]
    keys = ("num_draft_tokens", "verify_rows_per_req", "verify_tokens")
    assert [got[k] for k in keys] == [want[k] for k in keys], (got, want)
    assert (got["num_draft_tokens"], got["verify_rows_per_req"]) == (7, 8), got
