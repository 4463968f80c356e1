#!/usr/bin/env python3
"""ncu_stalls.py - the SASS lines of a kernel where its warps stall most, from the CSV of
`ncu -i REPORT --page source --csv --print-source sass`: the top N instructions by warp-state
samples, with each one's three largest stall reasons, and the totals per reason.

    ncu -i rep.ncu-rep --page source --csv --print-source sass > src.csv
    python3 ncu_stalls.py src.csv [N]
"""
import csv
import sys


def num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def read_source_csv(path):
    """The header and the SASS lines of ncu's source-page CSV (also the reader of dev/backward/sass_mix.py
    and ncu_smem_split.py)."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"Address"') or l.startswith("Address"))
    rows = list(csv.reader(lines[start:]))
    return rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    head, body = read_source_csv(path)
    allc = next(i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All"))
    src = head.index("Source")
    reasons = [i for i, h in enumerate(head) if h.startswith("stall_") or (h.startswith("Stall") and "Sampl" not in h)]
    total = sum(num(r[allc]) for r in body) or 1.0
    print(f"{len(body)} SASS lines, {total:.0f} samples; reason columns: {len(reasons)}")
    tot = {head[i]: sum(num(r[i]) for r in body) for i in reasons}
    print("per reason: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:10]))
    for idx, r in sorted(enumerate(body), key=lambda ir: -num(ir[1][allc]))[:top]:
        rs = sorted(((num(r[i]), head[i]) for i in reasons), reverse=True)[:3]
        why = " ".join(f"{h}={v:.0f}" for v, h in rs if v > 0)
        print(f"{idx:5d} {100 * num(r[allc]) / total:5.1f}%  {r[src][:70]:70s} {why}")


if __name__ == "__main__":
    main()
