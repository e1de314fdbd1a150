"""Plan vs real start for the draft heads (issue 44): `sglang plan --json` and a real sglang.Engine start with the same
flags (fp32, --max-total-memory-gb 1, CPU) over random checkpoints from sglang.test -- a 6-layer Llama target with a
random EAGLE3 head and a 2-layer EAGLE-1 head, and a 2-layer DeepSeek-V3 with one MTP layer (NEXTN). Prints, per
algorithm, the planned and started KV tokens and their ratio, and the draft pool / head tensor bytes beside their
plan terms (the started plan's and the dry run's). The tests assert the same relations (test_spec_eagle_engine,
test_spec_nextn_engine); this prints the figures.

    python3 benchmark/spec_plan_vs_start.py [EAGLE3] [EAGLE] [NEXTN]
"""

import json
import sys
import tempfile

from transformers import AutoTokenizer

from sglang import Engine
from sglang.cli.plan import run
from sglang.test.deepseek_mtp import save_v3_with_mtp
from sglang.test.eagle_heads import make_eagle3_head, make_eagle_head, make_llama_target
from sglang.test.engine_fixtures import default_model_dir


def checkpoints(tmp: str) -> dict:
    """algorithm -> (target path, head path or None: NEXTN reads the target's own MTP layer)."""
    tok = AutoTokenizer.from_pretrained(default_model_dir())
    target = make_llama_target(tmp + "/target", tok)
    return {"EAGLE3": (target, make_eagle3_head(tmp + "/eagle3", target)),
            "EAGLE": (target, make_eagle_head(tmp + "/eagle", target, layers=2)),
            "NEXTN": (save_v3_with_mtp(tmp + "/deepseek", 2, vocab=(len(tok) + 63) // 64 * 64, tokenizer=tok), None)}


def measure(algorithm: str, target: str, head) -> dict:
    flags = ["--model-path", target, "--dtype", "float32", "--speculative-algorithm", algorithm,
             "--max-total-memory-gb", "1"] + (["--speculative-draft-model-path", head] if head else [])
    status, result, _ = run(["--device", "cpu"] + flags + ["--json"])
    assert status == 0, result
    dry = result["plan"]
    dry_terms = {t["name"]: t["num_bytes"] for t in dry["terms"]}
    kw = dict(dtype="float32", speculative_algorithm=algorithm, max_total_memory_gb=1, log_level="warning")
    if head:
        kw["speculative_draft_model_path"] = head
    engine = Engine(model_path=target, **kw)
    try:
        runner = engine.scheduler.model_runner
        plan, draft = runner.memory_plan, runner.draft_runner
        return dict(algorithm=algorithm, planned_tokens=dry["max_total_num_tokens"],
                    started_tokens=plan.max_total_num_tokens,
                    ratio=round(plan.max_total_num_tokens / dry["max_total_num_tokens"], 4),
                    draft_kv_pool_bytes=draft.kv_bytes(), draft_kv_cache_term=plan.bytes_of("draft_kv_cache"),
                    draft_tensor_bytes=draft.weight_bytes, draft_weights_term=plan.bytes_of("draft_weights"),
                    dry_run_draft_weights=dry_terms["draft_weights"])
    finally:
        engine.shutdown()


def main(argv) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cases = checkpoints(tmp)
        for algorithm in argv or list(cases):
            print(json.dumps(measure(algorithm, *cases[algorithm])), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
