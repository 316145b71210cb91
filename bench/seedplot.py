# SPDX-License-Identifier: Apache-2.0 OR MIT
"""bench/seedplot.py - the omniORB oneway plot of bench/seeds (the ORL paper's Figure 4 in our
run's numbers): throughput at the server against block size, log-log, one line per transport and
placement, every point marked (a series of one point is still seen).  Plain SVG, nothing to
install."""
import math

W, H, L, R, T, B = 760, 460, 80, 190, 50, 60
COLORS = {"kernel": "#1f77b4", "memlan": "#d62728"}
DASH = {"split": "", "same": "6,4", "unpinned": "2,3"}
NAMES = {"kernel": "kernel TCP", "memlan": "memlan"}


def _size_label(b):
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n} {unit}"
    return f"{b} B"


def _mb_label(v):
    return f"{v / 1000:g} GB/s" if v >= 1000 else f"{v:g} MB/s"


def oneway_series(results):
    """{(mode, place): [(block bytes, MB/s median), ...]} from bench/seeds' results["omniorb"]."""
    out = {}
    for place, figs in (results.get("omniorb") or {}).items():
        for fig, c in figs.items():
            if not (fig.startswith("oneway ") and fig.endswith(" B: MBps")):
                continue
            size = int(fig.split()[1])
            for mode in ("kernel", "memlan"):
                v = c.get(mode)
                if v:
                    out.setdefault((mode, place), []).append((size, v))
    for pts in out.values():
        pts.sort()
    return out


def oneway_svg(results, title):
    """The SVG text, or None when the run measured no oneway figure."""
    series = oneway_series(results)
    if not series:
        return None
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    x0, x1 = math.log10(min(xs)), math.log10(max(xs))
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    x0, x1 = x0 - 0.2, x1 + 0.2  # the end points' markers inside the frame
    if y1 == y0:
        y1 = y0 + 1
    pw, ph = W - L - R, H - T - B

    def px(x):
        return L + (math.log10(x) - x0) / (x1 - x0) * pw

    def py(y):
        return T + ph - (math.log10(y) - y0) / (y1 - y0) * ph

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         'font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L}" y="{T - 20}" font-size="15">{title}</text>',
         f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>']
    for size in sorted(set(xs)):
        x = px(size)
        o.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{T + ph}" stroke="#eee"/>')
        o.append(f'<text x="{x:.1f}" y="{T + ph + 18}" text-anchor="middle">{_size_label(size)}</text>')
    for e in range(y0, y1 + 1):
        y = py(10 ** e)
        o.append(f'<line x1="{L}" y1="{y:.1f}" x2="{L + pw}" y2="{y:.1f}" stroke="#eee"/>')
        o.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{_mb_label(10 ** e)}</text>')
    o.append(f'<text x="{L + pw / 2}" y="{H - 15}" text-anchor="middle">block size</text>')
    o.append(f'<text x="18" y="{T + ph / 2}" text-anchor="middle" '
             f'transform="rotate(-90 18 {T + ph / 2})">oneway throughput at the server</text>')
    for i, ((mode, place), pts) in enumerate(sorted(series.items(), key=lambda kv: (kv[0][1], kv[0][0]))):
        color, dash = COLORS[mode], DASH.get(place, "")
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        o.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"'
                 + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        for x, y in pts:
            o.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{color}"/>')
        ly = T + 10 + 20 * i
        o.append(f'<line x1="{L + pw + 15}" y1="{ly}" x2="{L + pw + 45}" y2="{ly}" stroke="{color}" '
                 'stroke-width="2"' + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        o.append(f'<circle class="legend" cx="{L + pw + 30}" cy="{ly}" r="3.5" fill="{color}"/>')
        o.append(f'<text x="{L + pw + 52}" y="{ly + 4}">{NAMES[mode]}, {place}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"
