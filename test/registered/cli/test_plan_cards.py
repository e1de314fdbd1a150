"""`sglang plan` over several cards (--gpu given more than once) and --plot FILE (.svg / .png; matplotlib, the
`plot` extra). The references: each card planned alone (one --gpu), the SVG's own text parsed as XML, the PNG's
IHDR header, the figure geometry the docstring of cli/plan_plot.py states (inches x 100 DPI)."""

import builtins
import contextlib
import io
import json
import os
import struct
import sys
import xml.etree.ElementTree as ET

import pytest

from sglang.cli.plan import main
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="cpu")

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mem_plan", "fixtures")
QWEN = os.path.join(FIXTURES, "qwen3-30b-a3b")
GiB = 2**30
CARDS = ["h100-80gb", "h20", "h200"]
CARD_NAMES = ["NVIDIA H100 80GB HBM3", "NVIDIA H20 96GB", "NVIDIA H200 141GB"]


def plan(argv, json_out=True):
    """(status, parsed --json output or the text)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = main(argv + (["--json"] if json_out else []))
    return status, (json.loads(buf.getvalue()) if json_out else buf.getvalue())


def gpus(*keys):
    return [a for k in keys for a in ("--gpu", k)]


@pytest.fixture(scope="module")
def alone():
    """Each card planned on its own: the reference for the several-card run."""
    return {k: plan(["--model-path", QWEN, "--gpu", k])[1] for k in CARDS + ["a100-40gb"]}


def test_several_cards_give_the_single_card_plans_in_order(alone):
    status, cards = plan(["--model-path", QWEN, *gpus(*CARDS)])
    assert status == 0 and isinstance(cards, list)
    assert cards == [alone[k] for k in CARDS]
    assert [c["gpu"] for c in cards] == CARD_NAMES
    # the text prints the same plans one after the other
    status, text = plan(["--model-path", QWEN, *gpus(*CARDS)], json_out=False)
    heads = [text.index(f"on {name} x tp=1") for name in CARD_NAMES]
    assert status == 0 and heads == sorted(heads)
    for k in CARDS:
        assert f"KV pool: {alone[k]['plan']['max_total_num_tokens']:,} tokens" in text


def test_one_card_that_does_not_fit_makes_the_run_fail(alone):
    status, cards = plan(["--model-path", QWEN, *gpus("h100-80gb", "a100-40gb")])
    assert status == 1 and [c["fits"] for c in cards] == [True, False]
    assert cards[1] == alone["a100-40gb"]


def svg_texts(path):
    root = ET.parse(path).getroot()
    return [("".join(el.itertext())).strip() for el in root.iter() if el.tag.endswith("}text")]


def test_svg_names_every_term_and_card_with_its_gib(tmp_path, alone):
    out = tmp_path / "cards.svg"
    status, _ = plan(["--model-path", QWEN, *gpus(*CARDS, "a100-40gb"), "--plot", str(out)])
    assert status == 1 and out.stat().st_size < 100_000
    texts = svg_texts(out)
    joined = "\n".join(texts)
    for name in CARD_NAMES + ["NVIDIA A100 40GB"]:
        assert name in texts, name
    for k in CARDS:
        p = alone[k]["plan"]
        for t in p["terms"]:
            if t["num_bytes"] > 0:  # a 0-byte term has no bar segment, so no legend entry
                assert t["name"] in texts, t["name"]
        weights = next(t["num_bytes"] for t in p["terms"] if t["name"] == "weights")
        kv = next(t["num_bytes"] for t in p["terms"] if t["name"] == "kv_cache")
        assert f"weights {weights / GiB:.1f}" in texts and f"kv_cache {kv / GiB:.1f}" in texts
        assert f"{p['max_total_num_tokens']:,} KV tokens" in joined
        total_gib = alone[k]["gpu_memory_total_mib"] / 1024
        assert f"total {total_gib:.1f}" in texts
        assert f"upstream y={alone[k]['upstream']['mem_fraction_static']:.4g}" in texts
    short = alone["a100-40gb"]["error"]["shortfall_bytes"] / GiB
    assert f"short by {short:.2f} GiB" in joined


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_png_is_a_png_of_the_stated_size(tmp_path):
    from matplotlib import image

    out = tmp_path / "cards.png"
    status, _ = plan(["--model-path", QWEN, *gpus("h100-80gb", "h200"), "--plot", str(out)])
    assert status == 0
    # 100 DPI; 6 in tall; 0.8 in left margin + 2.4 in legend + 1.0 in + 1.6 in per card wide
    assert png_size(out) == (740, 600)
    pixels = image.imread(str(out))
    assert pixels.shape[:2] == (600, 740) and len({tuple(p) for p in pixels.reshape(-1, pixels.shape[2])}) > 10


def test_a_pinned_fraction_shows_its_headroom(tmp_path):
    out = tmp_path / "pinned.svg"
    argv = ["--model-path", QWEN, "--gpu", "h200", "--mem-fraction-static", "0.8"]
    status, d = plan(argv + ["--plot", str(out)])
    headroom = d["plan"]["headroom_bytes"] / GiB
    assert status == 0 and headroom > 5  # the unused part of the runtime region
    assert f"headroom {headroom:.1f}" in svg_texts(out)


def test_a_hybrid_models_pools_are_bars_too(tmp_path):
    out = tmp_path / "hybrid.svg"
    status, d = plan(["--model-path", os.path.join(FIXTURES, "gpt-oss-20b"), "--gpu", "h100-80gb", "--plot", str(out)])
    terms = {t["name"]: t["num_bytes"] for t in d["plan"]["terms"]}
    assert status == 0 and terms["kv_windowed"] > 0
    texts = svg_texts(out)
    assert {n for n, b in terms.items() if b > 0} <= set(texts)
    assert f"kv_windowed {terms['kv_windowed'] / GiB:.1f}" in texts


def test_cpu_plan_plots_one_bar(tmp_path):
    out = tmp_path / "cpu.svg"
    status, d = plan(["--device", "cpu", "--total-memory-gb", "2", "--plot", str(out)])
    assert status == 0 and isinstance(d, dict)
    texts = svg_texts(out)
    assert "CPU" in texts and "total 2.0" in texts


def refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code, capsys.readouterr().err


def test_plot_without_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    out = tmp_path / "cards.png"
    code, err = refused(["--model-path", QWEN, "--gpu", "h100-80gb", "--plot", str(out)], capsys)
    assert code == 2 and 'pip install "sglang[plot]"' in err and not out.exists()


@pytest.mark.parametrize("argv,fragment", [
    (["--gpu", "h100-80gb", "--plot", "cards.pdf"], "'.pdf'"),
    (["--gpu", "h100-80gb", "--plot", "cards"], "'(none)'"),
    (["--gpu", "h100-80gb", "--gpu", "h1000"], "'h1000'"),
])
def test_bad_plot_file_or_card_is_refused(argv, fragment, capsys):
    code, err = refused(["--model-path", QWEN, *argv], capsys)
    assert code == 2 and fragment in err, err


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
