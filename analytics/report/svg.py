"""Small inline-SVG chart primitives (line with optional second axis, horizontal bars).

Hand-rolled on purpose: the report must open offline with no JavaScript
library, and these two chart kinds carry every figure in it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from html import escape

PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#475569", "#ea580c")


def fmt_num(v: float, unit: str = "") -> str:
    """Compact axis label: 1.2k, 3.4M; µs values become ms/s."""
    if unit == "µs":
        if abs(v) >= 1e6:
            return f"{v / 1e6:.3g} s"
        if abs(v) >= 1e3:
            return f"{v / 1e3:.3g} ms"
        return f"{v:.3g} µs"
    if unit == "B/s" or unit == "B":
        for u in ("", "Ki", "Mi", "Gi"):
            if abs(v) < 1024:
                return f"{v:.3g} {u}{unit}"
            v /= 1024
        return f"{v:.3g} Ti{unit}"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suf}"
    return f"{v:.3g}" if v != int(v) else f"{int(v)}"


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


def _x_label(v: float, span: float) -> str:
    d = dt.datetime.fromtimestamp(v, tz=dt.timezone.utc)
    return d.strftime("%H:%M:%S" if span < 600 else "%H:%M" if span < 2 * 86400 else "%m-%d %H:%M")


def line_chart(
    xs: Sequence[dt.datetime],
    series: dict[str, Sequence[float | None]],
    unit: str = "",
    right: dict[str, Sequence[float | None]] | None = None,
    right_unit: str = "",
    title: str = "",
    width: int = 860,
    height: int = 260,
) -> str:
    """Time-series lines; `right` series are drawn dashed on a second y axis (e.g. latency over concurrency)."""
    if not xs:
        return '<p class="empty">no data</p>'
    ml, mr, mt, mb = 64, (64 if right else 16), 28, 30
    pw, ph = width - ml - mr, height - mt - mb
    xv = [x.timestamp() if isinstance(x, dt.datetime) else float(x) for x in xs]
    x0, x1 = min(xv), max(xv)
    x1 = x1 if x1 > x0 else x0 + 1

    def sx(v: float) -> float:
        return ml + (v - x0) / (x1 - x0) * pw

    def axis(groups: dict[str, Sequence[float | None]]) -> tuple[list[float], float, float]:
        vals = [v for s in groups.values() for v in s if v is not None]
        hi = max(vals) if vals else 1
        ticks = nice_ticks(0, hi if hi > 0 else 1)
        return ticks, 0.0, ticks[-1]

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">']
    lt, llo, lhi = axis(series)
    for t in lt:
        y = mt + ph - (t - llo) / (lhi - llo) * ph
        out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{ml - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{escape(fmt_num(t, unit))}</text>')
    if right:
        rt, rlo, rhi = axis(right)
        for t in rt:
            y = mt + ph - (t - rlo) / (rhi - rlo) * ph
            out.append(f'<text x="{ml + pw + 6}" y="{y + 4:.1f}" class="tick">{escape(fmt_num(t, right_unit))}</text>')
    for t in nice_ticks(x0, x1, 6):
        if x0 <= t <= x1:
            out.append(f'<text x="{sx(t):.1f}" y="{height - 8}" class="tick" text-anchor="middle">{_x_label(t, x1 - x0)}</text>')
    out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{mt + ph}" y2="{mt + ph}" class="axis"/>')

    def path(vals: Sequence[float | None], lo: float, hi: float) -> str:
        d, pen = [], False
        for xvv, v in zip(xv, vals):
            if v is None:
                pen = False
                continue
            y = mt + ph - (v - lo) / (hi - lo) * ph
            d.append(f"{'L' if pen else 'M'}{sx(xvv):.1f},{y:.1f}")
            pen = True
        return " ".join(d)

    legend = []
    i = 0
    for name, vals in series.items():
        c = PALETTE[i % len(PALETTE)]
        out.append(f'<path d="{path(vals, llo, lhi)}" fill="none" stroke="{c}" stroke-width="1.8"><title>{escape(name)}</title></path>')
        legend.append((name, c, False))
        i += 1
    if right:
        for name, vals in right.items():
            c = PALETTE[i % len(PALETTE)]
            out.append(f'<path d="{path(vals, rlo, rhi)}" fill="none" stroke="{c}" stroke-width="1.8" stroke-dasharray="5 3"><title>{escape(name)}</title></path>')
            legend.append((name + (f" ({right_unit}, right axis)" if right_unit else " (right axis)"), c, True))
            i += 1
    lx = ml
    for name, c, dashed in legend:
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        out.append(f'<line x1="{lx}" x2="{lx + 18}" y1="12" y2="12" stroke="{c}" stroke-width="2.5"{dash}/>')
        out.append(f'<text x="{lx + 22}" y="16" class="legend">{escape(name)}</text>')
        lx += 30 + 7 * len(name)
    out.append("</svg>")
    return "".join(out)


def bar_chart(labels: Sequence[str], series: dict[str, Sequence[float | None]], unit: str = "", title: str = "",
              width: int = 860, max_bars: int = 15) -> str:
    """Horizontal grouped bars, one group per label (labels truncated to fit)."""
    labels = list(labels)[:max_bars]
    if not labels:
        return '<p class="empty">no data</p>'
    names = list(series)
    bar_h, gap = 14, 8
    group_h = bar_h * len(names) + gap
    ml = min(260, 12 + 7 * max(len(str(lab)[:36]) for lab in labels))
    mt = 24 if len(names) > 1 else 6
    height = mt + group_h * len(labels) + 24
    pw = width - ml - 90
    vals = [v for s in series.values() for v in list(s)[: len(labels)] if v is not None]
    hi = max(vals) if vals else 1
    hi = hi if hi > 0 else 1
    ticks = nice_ticks(0, hi)
    top = ticks[-1]
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">']
    for t in ticks:
        x = ml + t / top * pw
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt}" y2="{height - 20}" class="grid"/>')
        out.append(f'<text x="{x:.1f}" y="{height - 6}" class="tick" text-anchor="middle">{escape(fmt_num(t, unit))}</text>')
    for gi, lab in enumerate(labels):
        y0 = mt + gi * group_h
        text = str(lab)
        short = text if len(text) <= 36 else text[:35] + "…"
        out.append(f'<text x="{ml - 6}" y="{y0 + group_h / 2 + 2:.1f}" class="label" text-anchor="end"><title>{escape(text)}</title>{escape(short)}</text>')
        for si, name in enumerate(names):
            v = list(series[name])[gi] if gi < len(series[name]) else None
            if v is None:
                continue
            w = max(0.5, v / top * pw)
            c = PALETTE[si % len(PALETTE)]
            y = y0 + si * bar_h
            out.append(f'<rect x="{ml}" y="{y}" width="{w:.1f}" height="{bar_h - 2}" rx="2" fill="{c}"><title>{escape(f"{text} — {name}: {fmt_num(v, unit)}")}</title></rect>')
            out.append(f'<text x="{ml + w + 4:.1f}" y="{y + bar_h - 4}" class="value">{escape(fmt_num(v, unit))}</text>')
    if len(names) > 1:
        lx = ml
        for si, name in enumerate(names):
            out.append(f'<rect x="{lx}" y="6" width="12" height="12" rx="2" fill="{PALETTE[si % len(PALETTE)]}"/>')
            out.append(f'<text x="{lx + 16}" y="16" class="legend">{escape(name)}</text>')
            lx += 30 + 7 * len(name)
    out.append("</svg>")
    return "".join(out)
