"""The run report's plots: same-sized SVG figures whose axes line up, with readable units.

Every figure has the same size and the same plot area (fixed margins, the legend in the
right margin), so the plots stacked in the report share their x positions. The y axis is
labelled in the unit of the quantity (bytes as KiB/MiB/GiB, seconds, rows with thousands
separators, shares as percentages) and never collapses to a ±0.04 band when every value is
zero. Pure apart from matplotlib: values in, SVG text out.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

Unit = Literal["bytes", "seconds", "rows", "share", "count"]

FIGURE_INCHES = (9.0, 2.7)
MARGINS = {"left": 0.09, "right": 0.78, "bottom": 0.3, "top": 0.86}


def format_value(value: float, unit: Unit) -> str:
    """One tick label or table cell in ``unit``."""
    if unit == "bytes":
        for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= scale:
                return f"{value / scale:.1f} {name}"
        return f"{value:.0f} B"
    if unit == "seconds":
        return f"{value:.1f} s" if abs(value) < 120 else f"{value / 60:.1f} min"
    if unit == "share":
        return f"{value:.0%}"
    return f"{value:,.0f}"


def plot_svg(
    title: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    unit: Unit,
    bars: bool = False,
) -> str:
    """One plot of ``series`` over the runs ``labels``, as an inline ``<svg>``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    figure, axes = plt.subplots(figsize=FIGURE_INCHES)
    figure.subplots_adjust(**MARGINS)
    positions = list(range(len(labels)))
    width = 0.8 / max(1, len(series))
    finite: list[float] = []
    for index, (name, values) in enumerate(series.items()):
        ys = [math.nan if v is None else float(v) for v in values]
        finite += [y for y in ys if not math.isnan(y)]
        if bars:
            offset = (index - (len(series) - 1) / 2) * width
            axes.bar([p + offset for p in positions], ys, width=width, label=name)
        else:
            axes.plot(positions, ys, marker="o", label=name)
    axes.set_title(title, fontsize=10, loc="left")
    axes.set_xticks(positions)
    axes.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    axes.tick_params(axis="y", labelsize=8)
    axes.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v, unit)))
    if unit in ("rows", "count"):
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    top = max(finite, default=0.0)
    if unit == "share":
        axes.set_ylim(0, 1.05)
    elif top <= 0:
        axes.set_ylim(0, 1)  # all zero (or nothing): a flat line on the floor, not ±0.04
    else:
        axes.set_ylim(0, top * 1.1)
    if positions:
        axes.set_xlim(-0.6, len(positions) - 0.4)
    if series:
        axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    axes.grid(alpha=0.3)
    try:
        return _svg(figure)
    finally:
        plt.close(figure)


def _svg(figure: Any) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")  # no tight box: every figure keeps its size
    text = buffer.getvalue()
    return text[text.index("<svg") :]
