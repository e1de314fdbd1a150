"""The zoo's table: every published config under test/registered/mem_plan/fixtures/ planned by `sglang plan` on
H100-80GB, H200 and MI300X (issue 40's closing note). Offline: config.json only, no weights, no network, no GPU.

    python benchmark/plan_zoo.py                                  # every fixture, the three cards
    python benchmark/plan_zoo.py --model llama-3.1-8b --gpu h200  # a subset
    python benchmark/plan_zoo.py -- --kv-cache-dtype fp8_e4m3     # flags after -- go to every `sglang plan`

One markdown row per (model, card): whether it fits, the pools' sizes (full-layer KV tokens, windowed tokens,
linear-state slots), request slots, full-context requests that fit at once, and upstream SGLang's classic auto
mem_fraction_static on the same inputs with the KV tokens, SWA tokens and Mamba state slots its default ratio knobs
would give (cli/plan_upstream.py). A model the
planner refuses gets one row with the refusal, as `sglang plan` words it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from typing import Optional

from sglang.cli.plan import run as plan_run

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "test", "registered", "mem_plan", "fixtures")
DEFAULT_GPUS = ("h100-80gb", "h200", "mi300x")
COLUMNS = ("model", "model_type", "params (B)", "card", "fits", "full KV tokens", "windowed tokens", "state slots",
           "slots", "context", "full-context requests", "upstream classic y", "upstream KV tokens", "upstream SWA tokens",
           "upstream state slots")


def fixture_models(root: str = FIXTURES) -> list[str]:
    return sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "config.json")))


def plan_card(model_dir: str, gpu: str, extra: list[str]) -> tuple[Optional[dict], Optional[str]]:
    """(the `sglang plan --json` result, None) or (None, the refusal `sglang plan` prints)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            _, result, _ = plan_run(["--model-path", model_dir, "--gpu", gpu, *extra])
        return result, None
    except SystemExit:  # a usage error: the refusal is on stderr after "error: "
        text = err.getvalue().strip()
        return None, text.split("error: ", 1)[-1] if "error: " in text else text or "refused"
    except Exception as e:  # noqa: BLE001 -- the table reports it; the issue allows no traceback in the zoo
        return None, f"TRACEBACK {type(e).__name__}: {e}"


def _n(value) -> str:
    return f"{value:,}" if value else "-"


def card_row(name: str, gpu: str, r: dict) -> list[str]:
    head = [name, r["model_type"], f"{r['num_params'] / 1e9:.2f}", gpu]
    up = r.get("upstream") or {}
    upstream = [f"{up['mem_fraction_static']:.4g}" if up else "-"]
    if up and up["starts"]:
        upstream += [_n(up["max_total_num_tokens"]), _n(up["swa_tokens"]), _n(up["mamba_cache_slots"])]
    else:
        upstream += ["fails to start" if up else "-", "-", "-"]
    if not r["fits"]:
        short = r["error"].get("shortfall_bytes", 0) / 2**30
        verdict = f"no (short {short:.2f} GiB" + (f"; --tp {r['fits_with_tp']} fits)" if r.get("fits_with_tp")
                                                  else ")") if short else "no"
        return head + [verdict, "-", "-", "-", "-", f"{r['context_len']:,}", "0"] + upstream
    p = r["plan"]
    full = _n(p["max_total_num_tokens"]) if p.get("has_full_pool", True) else "none"
    full_ctx = p.get("full_context_requests", p["max_total_num_tokens"] // p["context_len"])
    return head + ["yes", full, _n(p.get("windowed_tokens", 0)), _n(p.get("state_slots", 0)),
                   f"{p['max_running_requests']:,}", f"{p['context_len']:,}", f"{full_ctx:,}"] + upstream


def refusal_row(name: str, gpus: str, message: str) -> list[str]:
    return [name, "-", "-", gpus, "refused: " + message.replace("|", "/").replace("\n", " ")] + ["-"] * (len(COLUMNS) - 5)


def zoo_rows(models: list[str], gpus: list[str], extra: list[str], root: str = FIXTURES) -> list[list[str]]:
    rows = []
    for name in models:
        cards = [(gpu, *plan_card(os.path.join(root, name), gpu, extra)) for gpu in gpus]
        refusals = {msg for _, res, msg in cards if res is None}
        if len(refusals) == 1 and all(res is None for _, res, _ in cards):  # refused alike on every card
            rows.append(refusal_row(name, ", ".join(gpus), refusals.pop()))
            continue
        rows += [card_row(name, gpu, res) if res is not None else refusal_row(name, gpu, msg)
                 for gpu, res, msg in cards]
    return rows


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="plan_zoo.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--fixtures", default=FIXTURES, help="a directory of <model>/config.json")
    p.add_argument("--model", action="append", default=None, help="a fixture's directory name (repeatable)")
    p.add_argument("--gpu", action="append", default=None, help=f"a card preset (repeatable); default {DEFAULT_GPUS}")
    ns = p.parse_args(own)
    known = fixture_models(ns.fixtures)
    models = ns.model or known
    missing = [m for m in models if m not in known]
    if missing:
        p.error(f"--model {', '.join(missing)}: no such fixture under {ns.fixtures}; known: {', '.join(known)}")
    rows = zoo_rows(models, list(ns.gpu or DEFAULT_GPUS), extra, ns.fixtures)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
