"""Small inline-SVG chart primitives (line with optional second axis, horizontal bars).

Hand-rolled on purpose: the report must open offline with no JavaScript
library, and these two chart kinds carry every figure in it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from html import escape

WIDTH = 1230  # user units = CSS px in the report's column, so text in a chart is the size of the page's text
PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#475569", "#ea580c")


def _g3(v: float) -> str:
    """About 3 significant digits, never in exponent form (1000 → "1000", 0.0483 → "0.048")."""
    a = abs(v)
    if a >= 100 or v == int(v):
        return f"{v:.0f}"
    return (f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 0.1 else f"{v:.3f}").rstrip("0").rstrip(".")


def fmt_num(v: float, unit: str = "") -> str:
    """Compact value: 1.2k, 3.4M; bytes as KiB/MiB; µs values become ms/s."""
    if unit == "µs":
        if abs(v) >= 1e6:
            return f"{_g3(v / 1e6)} s"
        if abs(v) >= 1e3:
            return f"{_g3(v / 1e3)} ms"
        return f"{_g3(v)} µs"
    if unit == "B/s" or unit == "B":
        if v == 0:
            return f"0 {unit}"
        for u in ("", "Ki", "Mi", "Gi"):
            if abs(v) < 1024:
                return f"{_g3(v)} {u}{unit}"
            v /= 1024
        return f"{_g3(v)} Ti{unit}"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{_g3(v / div)}{suf}"
    return _g3(v)


_BYTE_UNITS = ("B", "B/s")
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)


def axis_scale(hi: float, unit: str) -> tuple[float, str]:
    """(divisor, label unit) so every tick of an axis reaching `hi` is shown in one unit: 0, 512, 1 KiB… never mixed."""
    if unit in _BYTE_UNITS:
        div, prefix = 1.0, ""
        for p in ("Ki", "Mi", "Gi", "Ti"):
            if hi < 1024 * div:
                break
            div, prefix = div * 1024, p
        return div, f"{prefix}{unit}"
    if unit == "µs":
        return (1e6, "s") if hi >= 1e6 else (1e3, "ms") if hi >= 1e3 else (1.0, "µs")
    return 1.0, unit


def tick_label(v: float, unit: str) -> str:
    """A tick already divided into its axis unit: at most 3 significant digits, thousands as k/M (plain units)."""
    if v == 0:
        return "0"
    if unit and unit not in ("B", "KiB", "MiB", "GiB", "TiB", "ms", "s", "µs") and not unit.endswith("B/s"):
        return fmt_num(v) + f" {unit}"
    if not unit:
        return fmt_num(v)
    return f"{_g3(v)} {unit}"


def scaled_ticks(hi: float, unit: str, n: int = 5, integer: bool = False) -> tuple[list[float], list[str]]:
    """Nice tick values (in the data's unit) and their labels, all in one display unit (whole numbers for counts)."""
    div, shown = axis_scale(hi, unit)
    ticks = nice_ticks(0, (hi if hi > 0 else 1) / div, n)
    if integer and ticks[1] - ticks[0] < 1:
        ticks = [float(t) for t in range(0, int(math.ceil(ticks[-1])) + 1)]
    return [t * div for t in ticks], [tick_label(t, shown) for t in ticks]


def time_ticks(x0: float, x1: float, n: int = 7, min_step: float = 1) -> list[float]:
    """Epoch-second ticks at round clock times (1 s … 1 week apart), never two with the same label."""
    span = max(x1 - x0, 1)
    step = next((st for st in _TIME_STEPS if st >= max(span / n, min_step)), _TIME_STEPS[-1])
    first = math.ceil(x0 / step) * step
    return [first + i * step for i in range(int((x1 - first) // step) + 1)]


def time_label(v: float, step: float, span: float) -> str:
    d = dt.datetime.fromtimestamp(v, tz=dt.timezone.utc)
    fmt = "%H:%M:%S" if step < 60 else "%H:%M"
    return d.strftime(("%m-%d " + fmt) if span >= 86400 else fmt)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = [round(start, 10)]
    while ticks[-1] < hi - step * 1e-9:  # the last tick is >= hi so nothing is drawn past the axis
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _xs(xs: Sequence[dt.datetime | float]) -> list[float]:
    return [x.replace(tzinfo=x.tzinfo or dt.timezone.utc).timestamp() if isinstance(x, dt.datetime) else float(x) for x in xs]


def _time_axis(out: list[str], x0: float, x1: float, sx, y: float, min_step: float = 1) -> None:
    ticks = time_ticks(x0, x1, min_step=min_step)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else max(min_step, 1)
    right = sx(x1)
    for t in ticks:
        x = sx(t)
        anchor = "end" if x > right - 24 else "middle"  # the last label stays inside the chart
        out.append(f'<text x="{x:.1f}" y="{y}" class="tick" text-anchor="{anchor}">{time_label(t, step, x1 - x0)}</text>')


def _legend_rows(items: Sequence[str], x0: float, right: float) -> list[tuple[float, int]]:
    """(x, row) of each legend entry, wrapping onto a new row instead of running off the chart."""
    pos, x, row = [], x0, 0
    for name in items:
        w = 34 + 8 * len(name)  # wide enough for capitals (error names)
        if x > x0 and x + w > right:
            x, row = x0, row + 1
        pos.append((x, row))
        x += w
    return pos


def legend_height(items: Sequence[str], x0: float, right: float) -> int:
    return 0 if not items else 18 * (max(r for _, r in _legend_rows(items, x0, right)) + 1)


def _legend(out: list[str], items: list[tuple[str, str, bool]], x: float, box: bool = False, right: float = 1e9) -> None:
    for (name, c, dashed), (lx, row) in zip(items, _legend_rows([i[0] for i in items], x, right)):
        y = 12 + 18 * row
        if box:
            out.append(f'<rect x="{lx}" y="{y - 6}" width="12" height="12" rx="2" fill="{c}"/>')
        else:
            dash = ' stroke-dasharray="5 3"' if dashed else ""
            out.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{y}" y2="{y}" stroke="{c}" stroke-width="2.5"{dash}/>')
        out.append(f'<text x="{lx + 22}" y="{y + 4}" class="legend">{escape(name)}</text>')


def _y_label(out: list[str], text: str, x: float, y: float) -> None:
    if text:
        out.append(f'<text x="{x}" y="{y}" class="axislabel" transform="rotate(-90 {x} {y})" text-anchor="middle">{escape(text)}</text>')


def line_chart(
    xs: Sequence[dt.datetime],
    series: dict[str, Sequence[float | None]],
    unit: str = "",
    right: dict[str, Sequence[float | None]] | None = None,
    right_unit: str = "",
    title: str = "",
    width: int = WIDTH,
    height: int = 260,
    y_label: str = "",
    right_label: str = "",
) -> str:
    """Time-series lines; `right` series are drawn dashed on a second y axis (e.g. latency over concurrency)."""
    if not xs:
        return '<p class="empty">no data</p>'
    names = list(series) + [n + " (right axis)" for n in (right or {})]
    ml, mr, mb = 84, (84 if right else 16), 30
    mt = 12 + legend_height(names, ml, width - mr)
    height += mt - 28
    pw, ph = width - ml - mr, height - mt - mb
    xv = _xs(xs)
    x0, x1 = min(xv), max(xv)
    if x1 <= x0:  # one point in time: in the middle, under its own time label
        x0, x1 = x0 - 0.5, x0 + 0.5

    def sx(v: float) -> float:
        return ml + (v - x0) / (x1 - x0) * pw

    def axis(groups: dict[str, Sequence[float | None]], u: str) -> tuple[list[float], list[str], float]:
        vals = [v for s in groups.values() for v in s if v is not None]
        hi = max(vals) if vals else 1
        ticks, labels = scaled_ticks(hi if hi > 0 else 1, u)
        return ticks, labels, ticks[-1]

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">']
    lt, ll, lhi = axis(series, unit)
    for t, lab in zip(lt, ll):
        y = mt + ph - t / lhi * ph
        out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{ml - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{escape(lab)}</text>')
    _y_label(out, y_label, 14, mt + ph / 2)
    rhi = 1.0
    if right:
        rt, rl, rhi = axis(right, right_unit)
        for t, lab in zip(rt, rl):
            y = mt + ph - t / rhi * ph
            out.append(f'<text x="{ml + pw + 6}" y="{y + 4:.1f}" class="tick">{escape(lab)}</text>')
        _y_label(out, right_label, width - 10, mt + ph / 2)
    _time_axis(out, x0, x1, sx, height - 8)
    out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{mt + ph}" y2="{mt + ph}" class="axis"/>')

    def path(vals: Sequence[float | None], hi: float) -> tuple[str, list[tuple[float, float]]]:
        """The line's path, and the points no segment reaches (a bare move draws nothing): those get a dot."""
        d, run, alone = [], [], []
        for xvv, v in [*zip(xv, vals), (None, None)]:  # the sentinel ends the last run
            if v is None or xvv is None:
                if len(run) == 1:
                    alone.append(run[0])
                run = []
                continue
            point = (sx(xvv), mt + ph - v / hi * ph)
            d.append(f"{'L' if run else 'M'}{point[0]:.1f},{point[1]:.1f}")
            run.append(point)
        return " ".join(d), alone

    def draw(name: str, vals: Sequence[float | None], hi: float, c: str, dash: str) -> None:
        d, alone = path(vals, hi)
        out.append(f'<path d="{d}" fill="none" stroke="{c}" stroke-width="1.8"{dash}><title>{escape(name)}</title></path>')
        out.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{c}"><title>{escape(name)}</title></circle>' for x, y in alone)

    legend = []
    i = 0
    for name, vals in series.items():
        c = PALETTE[i % len(PALETTE)]
        draw(name, vals, lhi, c, "")
        legend.append((name, c, False))
        i += 1
    if right:
        for name, vals in right.items():
            c = PALETTE[i % len(PALETTE)]
            draw(name, vals, rhi, c, ' stroke-dasharray="5 3"')
            legend.append((name + " (right axis)", c, True))
            i += 1
    _legend(out, legend, ml, right=width - mr)
    out.append("</svg>")
    return "".join(out)


def time_bars(xs: Sequence[dt.datetime], series: dict[str, Sequence[float | None]], bucket_s: float, unit: str = "",
              title: str = "", width: int = WIDTH, height: int = 240, y_label: str = "") -> str:
    """Counts per time bucket as stacked vertical bars (a count is per interval, not a line between points)."""
    if not xs:
        return '<p class="empty">no data</p>'
    ml, mr, mb = 84, 16, 30
    mt = 12 + legend_height(list(series), ml, width - mr)
    height += mt - 28
    pw, ph = width - ml - mr, height - mt - mb
    xv = _xs(xs)
    x0, x1 = min(xv), max(xv) + bucket_s
    totals = [sum(float(s[i] or 0) for s in series.values()) for i in range(len(xv))]
    ticks, labels = scaled_ticks(max(totals) if totals and max(totals) > 0 else 1, unit, integer=True)
    top = ticks[-1]

    def sx(v: float) -> float:
        return ml + (v - x0) / (x1 - x0) * pw

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">']
    for t, lab in zip(ticks, labels):
        y = mt + ph - t / top * ph
        out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{ml - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{escape(lab)}</text>')
    _y_label(out, y_label, 14, mt + ph / 2)
    bw = max(1.0, pw * bucket_s / (x1 - x0) - 1)
    for i, x in enumerate(xv):
        base = 0.0
        for si, (name, vals) in enumerate(series.items()):
            v = float(vals[i] or 0)
            if v <= 0:
                continue
            h = v / top * ph
            y = mt + ph - (base + v) / top * ph
            when = dt.datetime.fromtimestamp(x, tz=dt.timezone.utc).strftime("%H:%M:%S")
            out.append(f'<rect x="{sx(x):.1f}" y="{y:.1f}" width="{bw:.1f}" height="{h:.1f}" fill="{PALETTE[si % len(PALETTE)]}">'
                       f'<title>{escape(f"{when} {name}: {fmt_num(v)}")}</title></rect>')
            base += v
    _time_axis(out, x0, x1, sx, height - 8, min_step=bucket_s)
    out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{mt + ph}" y2="{mt + ph}" class="axis"/>')
    _legend(out, [(n, PALETTE[i % len(PALETTE)], False) for i, n in enumerate(series)], ml, box=True, right=width - mr)
    out.append("</svg>")
    return "".join(out)


def bar_chart(labels: Sequence[str], series: dict[str, Sequence[float | None]], unit: str = "", title: str = "",
              width: int = WIDTH, max_bars: int = 15, axis_label: str = "") -> str:
    """Horizontal grouped bars, one group per label (labels truncated to fit), in the order given."""
    labels = list(labels)[:max_bars]
    if not labels:
        return '<p class="empty">no data</p>'
    names = list(series)
    bar_h, gap = 14, 8
    group_h = bar_h * len(names) + gap
    ml = min(300, 14 + 7.6 * max(len(str(lab)[:36]) for lab in labels))
    mt = 6 + (legend_height(names, ml, width - 90) if len(names) > 1 else 0)
    mb = 38 if axis_label else 24
    height = mt + group_h * len(labels) + mb
    pw = width - ml - 90
    vals = [v for s in series.values() for v in list(s)[: len(labels)] if v is not None]
    hi = max((abs(v) for v in vals), default=1)  # negative values (an A − B difference) grow to the left of zero
    counts = not unit and all(float(v).is_integer() for v in vals)
    ticks, tick_labels = scaled_ticks(hi if hi > 0 else 1, unit, integer=counts)
    top = ticks[-1]
    div, shown = axis_scale(top, unit)
    neg, pos = any(v < 0 for v in vals), any(v > 0 for v in vals)
    span = pw / 2 if neg and pos else pw  # the width one side of zero gets
    zero = ml + (pw / 2 if neg and pos else pw if neg else 0)
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">']
    base_y = mt + group_h * len(labels)
    sides = ([-1] if neg else []) + ([1] if pos or not neg else [])
    for sign in sides:
        for t, lab in zip(ticks, tick_labels):
            if sign < 0 and t == 0 and pos:
                continue  # zero once
            x = zero + sign * t / top * span
            shown_lab = f"−{lab}" if sign < 0 and t else lab
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt}" y2="{base_y + 4}" class="grid"/>')
            out.append(f'<text x="{x:.1f}" y="{base_y + 16}" class="tick" text-anchor="middle">{escape(shown_lab)}</text>')
    if axis_label:
        out.append(f'<text x="{ml + pw / 2:.1f}" y="{height - 4}" class="axislabel" text-anchor="middle">{escape(axis_label)}</text>')
    for gi, lab in enumerate(labels):
        y0 = mt + gi * group_h
        text = str(lab)
        short = text if len(text) <= 36 else text[:35] + "…"
        out.append(f'<text x="{ml - 6}" y="{y0 + group_h / 2 + 2:.1f}" class="label" text-anchor="end"><title>{escape(text)}</title>{escape(short)}</text>')
        for si, name in enumerate(names):
            v = list(series[name])[gi] if gi < len(series[name]) else None
            if v is None:
                continue
            w = max(0.5, abs(v) / top * span)
            c = PALETTE[si % len(PALETTE)]
            y = y0 + si * bar_h
            value = tick_label(v / div, shown)
            x = zero - w if v < 0 else zero
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h - 2}" rx="2" fill="{c}"><title>{escape(f"{text} — {name}: {value}")}</title></rect>')
            tx, anchor = (x - 4, "end") if v < 0 else (zero + w + 4, "start")
            out.append(f'<text x="{tx:.1f}" y="{y + bar_h - 4}" class="value" text-anchor="{anchor}">{escape(value)}</text>')
    if len(names) > 1:
        _legend(out, [(n, PALETTE[i % len(PALETTE)], False) for i, n in enumerate(names)], ml, box=True, right=width - 90)
    out.append("</svg>")
    return "".join(out)


def all_zero(*series: dict[str, Sequence[float | None]] | None) -> bool:
    """True when no series has a non-zero value: such a chart is a flat line and only takes space."""
    return not any(v for group in series if group for vals in group.values() for v in vals if v)
