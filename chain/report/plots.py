"""The report's figures as PNG bytes (matplotlib, Agg backend: no display needed): training and
validation curves, Gantt charts of the planned and measured timelines, memory per device. Every text
is drawn as written (`literal`: no mathtext, no LaTeX), whatever a run's names hold."""

from __future__ import annotations

import functools
import io
from typing import Callable, Sequence, TypeVar

from chain.report.scalars import Series

COLORS = {"F": "#4C72B0", "B": "#DD8452", "W": "#C44E52", "update": "#8C8C8C", "copy": "#55A868"}
# The figures draw the user's text (a run directory's name, devices, tags): matplotlib would read a `$...$` pair in
# it as mathtext (a parse error, or a formula for a name) and all of it as LaTeX under the user's text.usetex.
LITERAL = {"text.parse_math": False, "text.usetex": False}
F = TypeVar("F", bound=Callable)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def literal(draw: F) -> F:
    """`draw` (a figure made and saved), with every text it draws shown as written (`LITERAL`)."""

    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        with _pyplot().rc_context(LITERAL):  # the texts read it when made, the ticks' when saved: both inside
            return draw(*args, **kwargs)

    return drawn  # type: ignore[return-value]


def png(fig) -> bytes:
    """The figure as PNG bytes (and closed)."""
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def family(tag: str) -> str:
    """Tags plotted on one axis: `loss` with `val_loss`, `accuracy` with `val_accuracy`, ..."""
    return tag[4:] if tag.startswith("val_") else tag


@literal
def curves(series: dict[str, dict[str, Series]], title: str) -> bytes:
    """One panel per family of tags; `series[label][tag]` is drawn as `label tag` (one label per run
    when runs are compared, or one empty label for a single run). Every tag is drawn: one with a
    single point (the validation of a run that evaluates only at its end, examples_per_second) as
    a dot."""
    plt = _pyplot()
    series = {label: {t: p for t, p in tags.items() if p} for label, tags in series.items()}
    families = sorted({family(t) for tags in series.values() for t in tags}, key=lambda f: (f != "loss", f))
    fig, axes = plt.subplots(1, max(1, len(families)), figsize=(4.2 * max(1, len(families)), 3.0), squeeze=False)
    for ax, fam in zip(axes[0], families):
        for label, tags in series.items():
            for tag in sorted(t for t in tags if family(t) == fam):
                points = tags[tag]
                name = f"{label} {tag}".strip()
                style = "--" if tag.startswith("val_") else "-"
                marker = "o" if len(points) == 1 else "." if len(points) < 30 else None
                ax.plot([s for s, _ in points], [v for _, v in points], style, marker=marker, label=name)
        ax.set_title(fam)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if not families:
        axes[0][0].text(0.5, 0.5, "no scalars", ha="center", va="center")
        axes[0][0].set_axis_off()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return png(fig)


@literal
def gantt(
    rows: Sequence[Sequence[tuple[float, float, str, str]]], labels: Sequence[str], title: str, xlabel: str
) -> bytes:
    """A Gantt chart: `rows[k]` lists stage k's bars as (start, length, kind, text); kind picks the
    colour (F, B, update, copy)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(rows) + 1.3))
    end = max([s + w for row in rows for s, w, _, _ in row] or [1.0])
    for k, row in enumerate(rows):
        y = len(rows) - 1 - k
        for start, width, kind, text in row:
            ax.broken_barh(
                [(start, width)],
                (y - 0.4, 0.8),
                facecolors=COLORS.get(kind, "#999999"),
                edgecolor="white",
                linewidth=0.5,
            )
            if text and width > end / 80:
                ax.text(start + width / 2, y, text, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(list(reversed(labels)), fontsize=8)
    ax.set_xlim(0, end)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    kinds = ["F", "B"] + (["W"] if any(kind == "W" for row in rows for _, _, kind, _ in row) else []) + ["update"]
    names = {"F": "forward", "B": "backward", "W": "weight gradients", "update": "update"}
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in kinds]
    ax.legend(handles, [names[k] for k in kinds], fontsize=7, loc="upper right", ncol=len(kinds))
    ax.set_title(title, fontsize=10)
    return png(fig)


@literal
def bars(labels: Sequence[str], values: Sequence[float], title: str, ylabel: str) -> bytes:
    """A bar chart (e.g. peak memory per device)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(labels) + 2), 2.8))
    ax.bar(range(len(values)), values, color="#4C72B0")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return png(fig)
