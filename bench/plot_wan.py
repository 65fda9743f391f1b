#!/usr/bin/env python3
"""Plot bench/wan_bench.sh's goodput against loss (issue 23).

    python3 bench/plot_wan.py -o out.png WAN_OUT/wan_bench.csv [more.csv ...]

Input: one or more CSV files as bench/wan_bench.sh writes them to $WAN_OUT/wan_bench.csv,
one row per run, with a header line naming the columns:

    op           write or read (ib_write_bw / ib_read_bw)
    rate         link rate, each direction, as WAN_RATE gave it (1gbit, 100gbit)
    rtt_ms       round trip, ms (2 × WAN_DELAY)
    tdf          time dilation factor K (1: real time; the figures are virtual either way)
    mb           MiB moved per run (WAN_MB messages of 1 MiB)
    loss_pct     random loss, % of packets, each direction (0, 0.01, 0.1, 1)
    mode         gbn, sel, gbn+dcqcn or sel+dcqcn (WAN_MODES)
    goodput_mbs  perftest's BW average, MB/s (10^6 B/s)
    pct_of_link  goodput as % of the link rate (~98.7-99.6 % is the ceiling: headers)
    virtual_s    the run's wall seconds ÷ K
    resent_pkts, timeouts, queue_drops
                 the client's retransmitted_pkts, retransmit_timeouts, wan_dropped_queue

An empty field was not measured. Only op, mode, loss_pct and pct_of_link are drawn: % of
link (y, 0-100) against loss % (x, categorical: the loss rates present, in numeric order),
one line per (op, mode), the median of the runs that share a cell; rows without
pct_of_link (a run that printed no BW average) are left out and counted on stderr. The
title names the rate, RTT, MiB per run and TDF (every distinct value, if the files mix
them). Needs matplotlib (Debian: apt-get install python3-matplotlib, for /usr/bin/python3).
"""

import argparse
import csv
import re
import statistics
import sys

REQUIRED = ("op", "mode", "loss_pct", "pct_of_link")
MODE_ORDER = ("gbn", "sel", "gbn+dcqcn", "sel+dcqcn")
MODE_NAME = {"gbn": "go-back-N", "sel": "selective",
             "gbn+dcqcn": "go-back-N + DCQCN", "sel+dcqcn": "selective + DCQCN"}
MODE_COLOR = {"gbn": "tab:red", "sel": "tab:blue",
              "gbn+dcqcn": "tab:orange", "sel+dcqcn": "tab:green"}
OP_STYLE = {"write": ("-", "o"), "read": ("--", "s")}


def read_rows(paths):
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                sys.exit(f"{path}: no column {', '.join(missing)} (a wan_bench.sh CSV?)")
            for line, row in enumerate(reader, start=2):
                row["_where"] = f"{path}:{line}"
                rows.append(row)
    return rows


def rate_name(rate):
    """'1gbit' → '1 Gbit/s', '500mbit' → '500 Mbit/s'; anything else as given."""
    m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)(bit|b)?", rate.strip().lower())
    if not m:
        return rate
    return f"{m.group(1)} {m.group(2).upper()}bit/s"


def distinct(rows, column, fmt=str):
    values = []
    for row in rows:
        v = (row.get(column) or "").strip()
        if v and fmt(v) not in values:
            values.append(fmt(v))
    return " / ".join(values) if values else "?"


def number(text):
    """'20' → '20', '20.0' → '20', '0.10' → '0.1'."""
    try:
        return f"{float(text):g}"
    except ValueError:
        return text


def main():
    ap = argparse.ArgumentParser(description="Plot % of link against loss from wan_bench.sh CSVs.")
    ap.add_argument("csv", nargs="+", help="wan_bench.csv files (rows are pooled)")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--title", help="replace the title built from rate, RTT, size and TDF")
    args = ap.parse_args()

    rows = read_rows(args.csv)
    cells = {}  # (op, mode) → {loss: [pct, ...]}
    skipped = 0
    for row in rows:
        pct = (row["pct_of_link"] or "").strip()
        if not pct or pct.lower() == "nan":
            skipped += 1
            continue
        try:
            loss, value = float(row["loss_pct"]), float(pct)
        except ValueError:
            sys.exit(f"{row['_where']}: loss_pct {row['loss_pct']!r} or pct_of_link {pct!r} "
                     "is not a number")
        key = (row["op"].strip(), row["mode"].strip())
        cells.setdefault(key, {}).setdefault(loss, []).append(value)
    if skipped:
        print(f"plot_wan: {skipped} row(s) without pct_of_link left out", file=sys.stderr)
    if not cells:
        sys.exit("plot_wan: no row with pct_of_link to plot")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = sorted({loss for per_loss in cells.values() for loss in per_loss})
    x_of = {loss: i for i, loss in enumerate(losses)}

    def order(key):
        op, mode = key
        return (("write", "read").index(op) if op in ("write", "read") else 2, op,
                MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    most_runs = 1
    for key in sorted(cells, key=order):
        op, mode = key
        per_loss = cells[key]
        xs = [x_of[loss] for loss in sorted(per_loss)]
        ys = [statistics.median(per_loss[loss]) for loss in sorted(per_loss)]
        most_runs = max(most_runs, max(len(v) for v in per_loss.values()))
        style, marker = OP_STYLE.get(op, (":", "^"))
        ax.plot(xs, ys, linestyle=style, marker=marker, color=MODE_COLOR.get(mode),
                label=f"{op.upper()} {MODE_NAME.get(mode, mode)}")

    ax.set_xticks(range(len(losses)))
    ax.set_xticklabels([f"{loss:g}" for loss in losses])
    ax.set_xlim(-0.3, len(losses) - 0.7)
    ax.set_ylim(0, 100)
    ax.set_xlabel("random loss, % of packets each direction")
    ax.set_ylabel("goodput, % of link rate" + (" (median of runs)" if most_runs > 1 else ""))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="lower left")
    title = args.title or (
        f"{distinct(rows, 'rate', rate_name)} × {distinct(rows, 'rtt_ms', number)} ms RTT, "
        f"{distinct(rows, 'mb', number)} MiB per run, TDF {distinct(rows, 'tdf', number)}")
    ax.set_title(title)
    fig.tight_layout()
    # No "Software" tag: the same rows give the same PNG with the same matplotlib.
    fig.savefig(args.output, dpi=100, metadata={"Software": None})
    print(args.output)


if __name__ == "__main__":
    main()
