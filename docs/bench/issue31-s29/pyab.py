import json, sys, glob, os, statistics
out = sys.argv[1]; names = sys.argv[2:]
rows = {}
for n in names:
    for f in sorted(glob.glob(f"{out}/{n}-*.json")):
        j = json.load(open(f))
        for r in j["results"]:
            rows.setdefault((r["impl"], r["op"]), {}).setdefault(n, []).append(r["median_us"])
        for b in j.get("binding", []):
            rows.setdefault(("cpp-" + b["impl"], b["op"]), {}).setdefault(n, []).append(b["cpp_median_us"])
for k, v in sorted(rows.items()):
    a, b = v.get(names[0], []), v.get(names[1], [])
    ratios = [y / x for x, y in zip(a, b)]
    print(f"{k[0]:10s} {k[1]:9s}", names[0], [round(x, 1) for x in a], names[1], [round(x, 1) for x in b],
          "pair ratios", [round(r, 3) for r in ratios], "median", round(statistics.median(ratios), 3) if ratios else None)
