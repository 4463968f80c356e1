#!/usr/bin/env python3
"""sass_mix.py - the instruction mix of a kernel from the CSV of `ncu -i REPORT --page source --csv
--print-source sass` (dev/backward/ncu_source.sh writes sass_<kernel>.csv): executed instructions and
warp-state samples per opcode, as shares of the kernel's totals. Section 10 of README.md reads
bwd_chain's this way (HMMA 6 % of its instructions, IMAD 21 %).

    python3 dev/backward/sass_mix.py OUT/sass_bwd_grad.csv [N]
"""
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "prefill"))
from ncu_stalls import num, read_source_csv  # noqa: E402


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 28
    head, body = read_source_csv(path)
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
