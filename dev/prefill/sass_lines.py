#!/usr/bin/env python3
"""sass_lines.py - source line and PTX instruction of SASS offsets in a cubin, for a workstation
without cuobjdump / nvdisasm (compute-sanitizer reports offsets like kernel+0xe400).

Build the cubin with the flags of the binary that was run plus -lineinfo (which leaves the kernel
code unchanged; check with --compare against a cubin built without it), then:

    nvcc <flags> -lineinfo -cubin -o k.cubin src/cuda/sm90_chunk_fwd.cu
    python3 dev/prefill/sass_lines.py k.cubin 'chunk_wg_kernelILi128E13' 0xe400 0xd5d0

Per offset: the 12-bit SASS opcode (0xfae LDGSTS, 0x83b LDSM, 0x984 LDS, 0x388 STS, 0xb1d / 0x51d
BAR, 0x91a DEPBAR, as read off this kernel's line tables), the innermost source line
(.debug_line) and the PTX instruction it came from (.nv_debug_line_sass into the embedded PTX).
--compare OTHER.cubin reports whether each kernel's code is byte-identical in both cubins.
"""
import bisect
import struct
import sys


def elf_sections(d):
    shoff, = struct.unpack_from('<Q', d, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', d, 0x3a)
    secs = []
    for i in range(shnum):
        nm, typ, _, _, off, size, link, _, _, _ = struct.unpack_from('<IIQQQQIIQQ', d, shoff + i * shentsize)
        secs.append({'nm': nm, 'off': off, 'size': size, 'link': link})
    stro = secs[shstrndx]['off']
    for s in secs:
        s['name'] = d[stro + s['nm']:d.index(b'\0', stro + s['nm'])].decode()
    return secs


def body(d, secs, name):
    for s in secs:
        if s['name'] == name:
            return d[s['off']:s['off'] + s['size']]
    return None


def uleb(d, p):
    r = s = 0
    while True:
        b = d[p]
        p += 1
        r |= (b & 0x7f) << s
        s += 7
        if b < 0x80:
            return r, p


def sleb(d, p):
    r, s = 0, 0
    while True:
        b = d[p]
        p += 1
        r |= (b & 0x7f) << s
        s += 7
        if b < 0x80:
            return r - (1 << s) if b & 0x40 else r, p


def symbols(d, secs):
    st = next(s for s in secs if s['name'] == '.symtab')
    strs = secs[st['link']]
    names = []
    for i in range(st['size'] // 24):
        nm, = struct.unpack_from('<I', d, st['off'] + 24 * i)
        o = strs['off'] + nm
        names.append(d[o:d.index(b'\0', o)].decode())
    return names


def line_rows(d, secs, secname):
    """DWARF 2 line program -> {function symbol: [(address, file, line)]}. The set_address
    operands are relocations against each kernel's text symbol (.rela<secname>)."""
    prog = body(d, secs, secname)
    syms = symbols(d, secs)
    rel = {}
    rs = body(d, secs, '.rela' + secname)
    for i in range(len(rs) // 24):
        off, info, _ = struct.unpack_from('<QQq', rs, 24 * i)
        rel[off] = syms[info >> 32]
    unit_len, _, hlen = struct.unpack_from('<IHI', prog, 0)
    _, _, lbase, lrange, opbase = struct.unpack_from('<BBbBB', prog, 10)
    stdlens = list(prog[15:15 + opbase - 1])
    p = 15 + opbase - 1
    while prog[p]:
        p = prog.index(b'\0', p) + 1
    p += 1
    files = []
    while prog[p]:
        q = prog.index(b'\0', p)
        files.append(prog[p:q].decode())
        p = q + 1
        for _ in range(3):
            _, p = uleb(prog, p)
    p, end = 10 + hlen, 4 + unit_len
    rows, cur, addr, f, line = {}, None, 0, 1, 1

    def emit():
        rows.setdefault(cur, []).append((addr, files[f - 1] if files else 'ptx', line))
    while p < end:
        op = prog[p]
        p += 1
        if op >= opbase:
            a = op - opbase
            addr += a // lrange
            line += lbase + a % lrange
            emit()
        elif op == 0:  # extended: end_sequence, set_address; NVIDIA's 0x90 (inlined-at) skipped
            ln, p = uleb(prog, p)
            sub = prog[p]
            if sub == 1:
                addr, f, line = 0, 1, 1
            elif sub == 2:
                cur = rel.get(p + 1, '?')
                addr, = struct.unpack_from('<Q', prog, p + 1)
            p += ln
        elif op == 1:
            emit()
        elif op == 2:
            v, p = uleb(prog, p)
            addr += v
        elif op == 3:
            v, p = sleb(prog, p)
            line += v
        elif op == 4:
            f, p = uleb(prog, p)
        elif op == 8:
            addr += (255 - opbase) // lrange
        elif op == 9:
            addr += struct.unpack_from('<H', prog, p)[0]
            p += 2
        elif op not in (6, 7):
            for _ in range(stdlens[op - 1]):
                _, p = uleb(prog, p)
    return {k: sorted(v) for k, v in rows.items()}


def at(rows, a):
    return rows[bisect.bisect_right([r[0] for r in rows], a) - 1]


def main():
    if len(sys.argv) >= 4 and sys.argv[2] == '--compare':
        d1, d2 = open(sys.argv[1], 'rb').read(), open(sys.argv[3], 'rb').read()
        s1, s2 = elf_sections(d1), elf_sections(d2)
        for s in s1:
            if s['name'].startswith('.text.'):
                print(body(d1, s1, s['name']) == body(d2, s2, s['name']), s['name'][6:])
        return
    d = open(sys.argv[1], 'rb').read()
    secs = elf_sections(d)
    kern = next(s['name'][6:] for s in secs if s['name'].startswith('.text.') and sys.argv[2] in s['name'])
    text = body(d, secs, '.text.' + kern)
    src = line_rows(d, secs, '.debug_line')[kern]
    ptx_rows = line_rows(d, secs, '.nv_debug_line_sass')[kern]
    ptx = body(d, secs, '.nv_debug_ptx_txt').replace(b'\0', b'\n').decode().split('\n')
    print(kern)
    for x in sys.argv[3:]:
        a = int(x, 16)
        opc = struct.unpack_from('<Q', text, a)[0] & 0xfff
        _, fname, line = at(src, a)
        _, _, pl = at(ptx_rows, a)
        print(f'+{a:#x} op {opc:#05x} {fname}:{line} | {ptx[pl - 1].strip()}')


if __name__ == '__main__':
    main()
