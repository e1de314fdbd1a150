"""`sglang plan --plot FILE`: the budget of one or more cards as stacked bars of the plan's terms.

Drawn from the --json results only (a card's `plan.terms`, `budget_bytes`, `headroom_bytes`,
`gpu_memory_total_mib`), so every term the planner adds appears without a change here. One bar per card: the terms
bottom-up in plan order, the headroom, then what the card holds outside the budget (its CUDA/HIP context and
communication buffers, or RAM above a cap); a tick marks the card's memory.total. A card that does not fit gets an
outlined bar of the budget and the shortfall above it. A dashed tick marks where upstream's classic auto
mem_fraction_static would end its static region (weights + KV: y x pre-load free). matplotlib is an optional extra (`sglang[plot]`), imported
only here and only when a plot is asked for.
"""

from __future__ import annotations

import os
from typing import Optional

from sglang.srt.mem_plan.units import GiB, MiB

PLOT_FORMATS = (".png", ".svg")
INSTALL_HINT = 'pip install "sglang[plot]"'
# Figure geometry: a fixed height and a width that grows with the cards, at a fixed DPI (PNG pixels = inches x DPI).
PLOT_DPI = 100
PLOT_HEIGHT_IN = 6.0
PLOT_LEFT_MARGIN_IN = 0.8
PLOT_LEGEND_IN = 2.4  # the legend column right of the axes
PLOT_BASE_WIDTH_IN = PLOT_LEFT_MARGIN_IN + PLOT_LEGEND_IN + 1.0
PLOT_WIDTH_PER_CARD_IN = 1.6
# A segment gets its GiB value written inside it when it is at least this share of the tallest bar.
LABEL_MIN_SHARE = 0.035
HEADROOM = "headroom"
UPSTREAM = "upstream's classic static region"
OUTSIDE = "outside the budget"


def plot_size_px(num_cards: int) -> tuple[int, int]:
    """(width, height) of the PNG for num_cards bars."""
    width_in = PLOT_BASE_WIDTH_IN + PLOT_WIDTH_PER_CARD_IN * max(num_cards, 1)
    return round(width_in * PLOT_DPI), round(PLOT_HEIGHT_IN * PLOT_DPI)


def check_plot_path(path: str) -> Optional[str]:
    """None when `path` can be written as a plot, else what to change."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in PLOT_FORMATS:
        return (f"--plot {path!r}: the extension {ext or '(none)'!r} is not a plot format; "
                f"name the file .png or .svg.")
    return None


def require_matplotlib() -> None:
    """Raises ImportError naming the extra when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError(f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}") from e


def _card_label(result: dict) -> str:
    name = result["gpu"] if result.get("gpu") not in (None, "cpu") else "CPU"
    up = result.get("upstream")
    return f"{name}\nupstream y={up['mem_fraction_static']:.4g}" if up else name


def _segments(result: dict) -> list[tuple[str, int]]:
    """(name, bytes) bottom-up: the plan's terms, the headroom, the card's memory outside the budget."""
    plan = result["plan"]
    segs = [(t["name"], int(t["num_bytes"])) for t in plan["terms"]]
    segs.append((HEADROOM, int(plan["headroom_bytes"])))
    segs.append((OUTSIDE, max(_card_total_bytes(result) - int(plan["budget_bytes"]), 0)))
    return segs


def _card_total_bytes(result: dict) -> int:
    mib = result.get("gpu_memory_total_mib")
    return int(mib) * MiB if mib else int(result["pre_load_free_bytes"])


def _title(results: list[dict]) -> str:
    first = results[0]
    return (f"{first['model']} ({first['model_type']}), tp={first['tp_size']}, context {first['context_len']:,}: "
            f"memory per rank")


def write_plot(results: list[dict], path: str) -> None:
    """Writes the bars of `results` (each a `sglang plan --json` result) to `path` (.png or .svg)."""
    problem = check_plot_path(path)
    if problem:
        raise ValueError(problem)
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt

    # text stays text in the SVG (searchable, small), not glyph outlines
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "sglang-plan"}):
        width_px, height_px = plot_size_px(len(results))
        fig = plt.figure(figsize=(width_px / PLOT_DPI, height_px / PLOT_DPI), dpi=PLOT_DPI)
        try:
            _draw(fig, results)
            fig.savefig(path, dpi=PLOT_DPI, format=os.path.splitext(path)[1][1:].lower(),
                        metadata={"Date": None} if path.lower().endswith(".svg") else None)
        finally:
            plt.close(fig)


def _colors(results: list[dict]) -> dict[str, object]:
    from matplotlib import colormaps

    names: list[str] = []
    for r in results:
        for name, _ in _segments(r) if r.get("fits") else ():
            if name not in names and name not in (HEADROOM, OUTSIDE):
                names.append(name)
    palette = colormaps["tab20"].colors
    colors = {name: palette[i % len(palette)] for i, name in enumerate(names)}
    colors[HEADROOM] = "#ffffff"
    colors[OUTSIDE] = "#bdbdbd"
    return colors


def _draw(fig, results: list[dict]) -> None:
    width_in = plot_size_px(len(results))[0] / PLOT_DPI
    axes_in = width_in - PLOT_LEFT_MARGIN_IN - PLOT_LEGEND_IN
    ax = fig.add_axes((PLOT_LEFT_MARGIN_IN / width_in, 0.1, axes_in / width_in, 0.8))
    colors = _colors(results)
    tallest = max(max(_card_total_bytes(r), r.get("plan", {}).get("budget_bytes", 0)
                      + (r.get("error") or {}).get("shortfall_bytes", 0)) for r in results) / GiB
    drawn: dict[str, object] = {}
    for x, r in enumerate(results):
        total_gib = _card_total_bytes(r) / GiB
        if r.get("fits"):
            bottom = 0.0
            for name, num_bytes in _segments(r):
                h = num_bytes / GiB
                if h <= 0:
                    continue
                bar = ax.bar(x, h, bottom=bottom, width=0.6, color=colors[name], edgecolor="#333333",
                             linewidth=0.5, hatch="//" if name == OUTSIDE else None, label=name)
                drawn.setdefault(name, bar)
                if h >= LABEL_MIN_SHARE * tallest:
                    ax.text(x, bottom + h / 2, f"{name} {h:.1f}", ha="center", va="center", fontsize=7)
                bottom += h
            plan = r["plan"]
            ax.text(x, total_gib, f"{plan['max_total_num_tokens']:,} KV tokens\n"
                    f"{plan['max_running_requests']:,} slots", ha="center", va="bottom", fontsize=7)
        else:
            budget_gib = r["pre_load_free_bytes"] / GiB
            short_gib = (r.get("error") or {}).get("shortfall_bytes", 0) / GiB
            ax.bar(x, budget_gib, width=0.6, fill=False, edgecolor="#b2182b", linewidth=1.2)
            if short_gib > 0:
                ax.bar(x, short_gib, bottom=budget_gib, width=0.6, color="#f4a582", edgecolor="#b2182b",
                       hatch="xx", linewidth=1.2)
            ax.text(x, budget_gib / 2, f"DOES NOT FIT\nshort by {short_gib:.2f} GiB", ha="center", va="center",
                    fontsize=8, color="#b2182b")
        up = r.get("upstream")
        if up:  # where upstream's classic static region (weights + KV) ends: y x pre-load free
            top = up["mem_fraction_static"] * r["pre_load_free_bytes"] / GiB
            line = ax.plot([x - 0.36, x + 0.36], [top, top], color="black", linewidth=1.0, linestyle="--")[0]
            drawn.setdefault(UPSTREAM, line)
        ax.plot([x - 0.4, x + 0.4], [total_gib, total_gib], color="black", linewidth=1.5)
        ax.text(x + 0.42, total_gib, f"total {total_gib:.1f}", va="center", ha="left", fontsize=7)
    ax.set_xticks(range(len(results)), [_card_label(r) for r in results], fontsize=8)
    ax.set_xlim(-0.6, len(results) - 0.4 + 0.4)  # room for the last "total" tick label
    ax.set_ylim(0, tallest * 1.12)
    ax.set_ylabel("GiB per rank")
    ax.set_title(_title(results), fontsize=9)
    names = [n for n in drawn if n != UPSTREAM][::-1] + [n for n in drawn if n == UPSTREAM]
    ax.legend([drawn[n] for n in names], names, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8,
              title="term (GiB in the bar)", title_fontsize=8, frameon=False)
