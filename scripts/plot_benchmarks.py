#!/usr/bin/env python3
"""Plots throughput against checkpoint size, for weightbay and its peers, as an SVG.

    scripts/plot_benchmarks.py OUT.svg SIZE_MIB=bench.csv [SIZE_MIB=bench.csv ...]

Each CSV is what `weightbay bench --csv` writes for one checkpoint size. Standard library only.
"""
import csv
import sys
from collections import defaultdict

W, H, LEFT, RIGHT, TOP, BOTTOM = 900, 520, 70, 330, 40, 60
# The cases worth a size sweep: throughput that depends on the checkpoint's size.
CASES = {"durable save", "mmap open + touch every byte", "WeightSource components over mmap (safetensors)"}
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def main():
    out, inputs = sys.argv[1], sys.argv[2:]
    series = defaultdict(dict)  # label -> {size_mib: GiB/s}
    for item in inputs:
        size, path = item.split("=", 1)
        size = float(size)
        with open(path) as f:
            for row in csv.DictReader(f):
                try:
                    nbytes = float(row["bytes"] or 0)
                except ValueError:  # a row from an older bench that did not quote its fields
                    continue
                if nbytes == 0:
                    continue
                gib = nbytes / 2**30
                case = row["case"]
                if case not in CASES:
                    continue
                series[f"weightbay: {case}"][size] = gib / float(row["ours_s"])
                if row["peer"]:
                    series[f"{row['peer']} ({case})"][size] = gib / float(row["peer_s"])
    sizes = sorted({s for points in series.values() for s in points})
    top = max(v for points in series.values() for v in points.values()) * 1.1
    px = lambda i: LEFT + (W - LEFT - RIGHT) * (i / max(1, len(sizes) - 1))
    py = lambda v: H - BOTTOM - (H - TOP - BOTTOM) * v / top
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="14">Throughput against checkpoint size (GiB/s, higher is better)</text>']
    for k in range(6):
        v = top * k / 5
        svg.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{LEFT - 8}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
    for i, size in enumerate(sizes):
        svg.append(f'<text x="{px(i):.1f}" y="{H - BOTTOM + 18}" text-anchor="middle">{size:g} MiB</text>')
    for n, (label, points) in enumerate(sorted(series.items())):
        color = COLORS[n % len(COLORS)]
        dash = "" if label.startswith("weightbay") else ' stroke-dasharray="5,3"'
        coords = [(px(sizes.index(s)), py(v)) for s, v in sorted(points.items())]
        svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in coords) + '"/>')
        for x, y in coords:
            svg.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>')
        ly = TOP + 14 * n
        svg.append(f'<line x1="{W - RIGHT + 10}" x2="{W - RIGHT + 30}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>')
        svg.append(f'<text x="{W - RIGHT + 35}" y="{ly + 4}">{label[:48]}</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
