# usage: cands.py BENCH.txt: per run of a decode/prefill bench text, ubep's op against the bound
# (the fastest candidate) and against the candidate the library's own policy corresponds to:
# combine: the fastest candidate without non-temporal output stores (the library streams
# outputs of 4 MiB and more only); dispatch: nt-store-32B-by-token (AVX2, token by token).
import re, sys
txt = open(sys.argv[1]).read()
for p in re.split(r'(?=ubep-bench: \w+ on)', txt):
    m = re.search(r'(bf16|fp8) layout', p)
    if not m:
        continue
    for op in ('dispatch', 'combine'):
        c = re.search(r'bound %s candidates \(median us\):(.*?)\|' % op, p)
        u = re.search(r'\nubep\s+%s\s+([\d.]+)' % op, p)
        if not (c and u):
            continue
        cands = {k: float(v) for k, v in re.findall(r'(\S+) ([\d.]+)', c.group(1))}
        best = min(cands, key=cands.get)
        if op == 'combine':
            own = min((v, k) for k, v in cands.items() if 'stream' not in k)
        else:
            own = (cands.get('nt-store-32B-by-token', cands[best]), 'nt-store-32B-by-token')
        us = float(u.group(1))
        print('%s %-8s ubep %7.1f  bound %7.1f (%s) x %.3f | %s %7.1f x %.3f' %
              (m.group(1), op, us, cands[best], best, us / cands[best], own[1], own[0], us / own[0]))
