#!/usr/bin/env python3
"""sass_mix.py - the instruction mix of a kernel from the CSV of `ncu -i REPORT --page source --csv
--print-source sass` (dev/backward/ncu_source.sh writes sass_<kernel>.csv): executed instructions and
warp-state samples per opcode, as shares of the kernel's totals. Section 10 of README.md reads
bwd_chain's this way (HMMA 6 % of its instructions, IMAD 21 %).

    python3 dev/backward/sass_mix.py OUT/sass_bwd_chain.csv [N]
"""
import collections
import csv
import sys


def num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 28
    lines = open(path).read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"Address"') or l.startswith("Address"))
    rows = list(csv.reader(lines[start:]))
    head, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    ie, src = head.index("Instructions Executed"), head.index("Source")
    smp = next(i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All"))
    instr, samples = collections.Counter(), collections.Counter()
    for r in body:
        words = r[src].split()
        if not words:
            continue
        op = (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]
        instr[op] += num(r[ie])
        samples[op] += num(r[smp])
    ti, ts = sum(instr.values()) or 1.0, sum(samples.values()) or 1.0
    print(f"{path}: {ti:.0f} warp instructions executed, {ts:.0f} samples")
    for op, v in instr.most_common(top):
        print(f"  {op:10s} {100 * v / ti:5.1f}% of instructions  {100 * samples[op] / ts:5.1f}% of samples")


if __name__ == "__main__":
    main()
