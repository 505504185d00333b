"""What every figure of the book shares: tick labels with a decimal comma, as the book's prose
writes numbers, and a log scale labelled the same way."""

from __future__ import annotations

from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

# Tick labels with a decimal comma, as the book's prose writes numbers.
COMMA = FuncFormatter(lambda x, _pos: f"{x:g}".replace(".", ","))


def decimal_comma(ax) -> None:
    ax.xaxis.set_major_formatter(COMMA)
    ax.yaxis.set_major_formatter(COMMA)


def integer_x(ax) -> None:
    """Ticks only at integers on the x axis (k, positions, counts), with a decimal comma on y."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    decimal_comma(ax)


def legend_below(ax, ncol: int = 2) -> None:
    """The legend under the axes, where it covers no data."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, frameon=False)


def log_y(ax) -> None:
    """Log y scale with ticks at 1, 2 and 5 of each decade, labelled with a decimal comma."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(COMMA)
    ax.yaxis.set_minor_formatter(NullFormatter())
