#!/usr/bin/env python3
"""ncu_smem_split.py - shared-memory wavefronts and bank-conflict excess of one kernel, split at its CTA
barriers, from the SASS page that dev/ncu_kernels.sh writes (sass_<kernel>.csv):

    python3 dev/prefill/ncu_smem_split.py sass_kda_prep.csv [TOP]

Prints the totals, then per barrier interval (SASS order, an interval ends at a BAR.SYNC) its share of
the stall samples and instructions and its wavefronts / excess, then the TOP instructions by excess.
The interval split is by position in the SASS, so a loop's body and its barrier land in one interval.
"""
import sys

from ncu_stalls import num, read_source_csv


def main():
    path = sys.argv[1]
    top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    head, data = read_source_csv(path)
    ix = {n: i for i, n in enumerate(head)}

    def val(r, name):
        return num(r[ix[name]]) if name in ix else 0.0

    keys = ("# Samples", "Instructions Executed", "L1 Wavefronts Shared", "L1 Wavefronts Shared Excessive")
    total = {k: sum(val(r, k) for r in data) for k in keys}
    print(f"shared wavefronts {total[keys[2]] / 1e6:.1f} M, excessive {total[keys[3]] / 1e6:.1f} M; "
          f"{total[keys[0]]:.0f} samples; {total[keys[1]] / 1e6:.1f} M warp instructions")
    start, acc = 0, dict.fromkeys(keys, 0.0)
    for k, r in enumerate(data):
        for key in keys:
            acc[key] += val(r, key)
        if "BAR.SYNC" in r[ix["Source"]] or k == len(data) - 1:
            print(f"SASS {start:5d}-{k:5d}  samples {100 * acc[keys[0]] / max(total[keys[0]], 1):5.1f}%  "
                  f"instr {100 * acc[keys[1]] / max(total[keys[1]], 1):5.1f}%  wavefronts {acc[keys[2]] / 1e6:6.2f} M  "
                  f"excess {acc[keys[3]] / 1e6:5.2f} M")
            start, acc = k + 1, dict.fromkeys(keys, 0.0)
    print("top excess:")
    for k in sorted(range(len(data)), key=lambda k: -val(data[k], keys[3]))[:top_n]:
        r = data[k]
        print(f"  {k:5d} {r[ix['Source']].strip()[:48]:48s} wavefronts {val(r, keys[2]) / 1e6:5.2f} M  "
              f"excess {val(r, keys[3]) / 1e6:5.2f} M  executed {val(r, keys[1]) / 1e6:5.2f} M")


if __name__ == "__main__":
    main()
