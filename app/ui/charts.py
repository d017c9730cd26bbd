"""Server-rendered SVG charts and the number formats of the dashboard.

Charts are small inline SVG (no script, no canvas): a line chart over time for rings of
samples, and a bar/line chart for snapshot history. Every value is a number formatted
here, so templates never put user text into SVG.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from markupsafe import Markup, escape

CHART_POINTS_MAX = 240
NONE = "\N{EN DASH}"
CHART_HEADROOM = 1.3
"""The top of a line chart over its highest point: room for the scale label."""
COLOURS = ("var(--c1)", "var(--c2)", "var(--c3)", "var(--c4)")


def human_bytes(value: float | int | None) -> str:
    if value is None:
        return NONE
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def human_count(value: float | int | None) -> str:
    if value is None:
        return NONE
    number = float(value)
    if abs(number) < 10_000:
        return f"{int(number):,}" if number == int(number) else f"{number:,.1f}"
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(number) >= size:
            return (
                f"{number / size:.1f}{unit}"
                if abs(number) < 100 * size
                else f"{number / size:.0f}{unit}"
            )
    raise AssertionError("unreachable")


def human_rate(value: float | int | None) -> str:
    if value is None:
        return NONE
    number = float(value)
    if number == 0:
        return "0/s"
    return f"{number:.1f}/s" if number < 100 else f"{human_count(round(number))}/s"


def human_ms(value: float | int | None) -> str:
    if value is None:
        return NONE
    number = float(value)
    return f"{number:.1f} ms" if number < 1000 else f"{number / 1000:.2f} s"


def clock(value: datetime | int | None) -> str:
    """UTC time of day, with the date when it is not today."""
    if value is None or value == 0:
        return NONE
    moment = value if isinstance(value, datetime) else datetime.fromtimestamp(value / 1000, tz=UTC)
    moment = moment.astimezone(UTC)
    if moment.date() == datetime.now(UTC).date():
        return moment.strftime("%H:%M:%S")
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _scale(values: Sequence[float], top: float, height: float) -> list[float]:
    return [height - (v / top) * height if top > 0 else height for v in values]


def line_chart(
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    width: int = 320,
    height: int = 64,
    label: str = "",
) -> Markup:
    """Lines over the same x axis (oldest left); the y axis starts at 0."""
    pad = 2
    longest = max((len(v) for _n, v in series), default=0)
    top = max((max(v[-CHART_POINTS_MAX:], default=0.0) for _n, v in series), default=0.0)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        f' role="img" aria-label="{escape(label)}" preserveAspectRatio="none">',
        f'<line class="axis" x1="0" y1="{height - 1}" x2="{width}" y2="{height - 1}"/>',
    ]
    if longest < 2:
        parts.append(
            f'<text class="empty" x="{width / 2}" y="{height / 2 + 4}" text-anchor="middle">'
            "collecting samples…</text>"
        )
    for position, (_name, values) in enumerate(series):
        values = list(values)[-CHART_POINTS_MAX:]
        if len(values) < 2:
            continue
        step = (width - 2 * pad) / (max(longest, 2) - 1)
        offset = longest - len(values)
        ys = _scale(values, top * CHART_HEADROOM, height - 2 * pad)
        points = " ".join(
            f"{pad + (offset + i) * step:.1f},{pad + y:.1f}" for i, y in enumerate(ys)
        )
        colour = COLOURS[position % len(COLOURS)]
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>'
        )
    parts.append(
        f'<text class="tick" x="{width - 2}" y="10" text-anchor="end">{escape(_tick(top))}</text>'
    )
    parts.append("</svg>")
    return Markup("".join(parts))


def _tick(top: float) -> str:
    return human_count(top) if top else "0"


def history_chart(
    checkpoints: Sequence[tuple[int, int]],
    reclaimed: Sequence[tuple[int, int]],
    *,
    width: int = 640,
    height: int = 120,
) -> Markup:
    """Checkpoint size (line with dots) and bytes reclaimed by compaction (bars), over
    time; both in bytes on one y axis. Points are ``(epoch_ms, bytes)``."""
    times = [t for t, _b in checkpoints] + [t for t, _b in reclaimed]
    parts = [
        f'<svg class="chart wide" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        ' role="img" aria-label="checkpoint bytes and reclaimed bytes over time">',
        f'<line class="axis" x1="0" y1="{height - 14}" x2="{width}" y2="{height - 14}"/>',
    ]
    if not times:
        parts.append(
            f'<text class="empty" x="{width / 2}" y="{height / 2}" text-anchor="middle">'
            "no snapshots or compactions yet</text></svg>"
        )
        return Markup("".join(parts))
    lo, hi = min(times), max(times)
    span = max(hi - lo, 1)
    top = max([b for _t, b in checkpoints] + [b for _t, b in reclaimed] + [1]) * 1.1
    plot_h, pad = height - 20, 8

    def x(t: int) -> float:
        return pad + (t - lo) / span * (width - 2 * pad) if hi > lo else width / 2

    def y(b: int) -> float:
        return 6 + plot_h - (b / top) * plot_h

    for t, b in reclaimed:
        parts.append(
            f'<rect class="bar-reclaimed" x="{x(t) - 3:.1f}" y="{y(b):.1f}" width="6"'
            f' height="{max(6 + plot_h - y(b), 1):.1f}"><title>reclaimed {escape(human_bytes(b))}'
            f" at {escape(clock(t))}</title></rect>"
        )
    ordered = sorted(checkpoints)
    if len(ordered) > 1:
        points = " ".join(f"{x(t):.1f},{y(b):.1f}" for t, b in ordered)
        parts.append(
            f'<polyline fill="none" stroke="var(--c1)" stroke-width="1.5" points="{points}"/>'
        )
    for t, b in ordered:
        parts.append(
            f'<circle cx="{x(t):.1f}" cy="{y(b):.1f}" r="3" fill="var(--c1)">'
            f"<title>checkpoint {escape(human_bytes(b))} at {escape(clock(t))}</title></circle>"
        )
    parts.append(
        f'<text class="tick" x="{width - 2}" y="10" text-anchor="end">'
        f"{escape(human_bytes(top / 1.1))}</text>"
    )
    parts.append(
        f'<text class="tick" x="2" y="{height - 2}">{escape(clock(lo))}</text>'
        f'<text class="tick" x="{width - 2}" y="{height - 2}" text-anchor="end">'
        f"{escape(clock(hi))}</text></svg>"
    )
    return Markup("".join(parts))


FILTERS = {
    "bytes": human_bytes,
    "num": human_count,
    "rate": human_rate,
    "ms": human_ms,
    "clock": clock,
}
