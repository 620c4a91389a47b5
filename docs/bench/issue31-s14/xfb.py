import json,glob,sys,statistics as st,collections
d=collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1]+'/[AB]-*.json')):
    n=f.split('/')[-1][0]; res=json.load(open(f))['results']
    for r in res:
        if r['impl'] not in ('ubep','bsp'): continue
        d[(r['dtype'],r['impl'],r['op'],n,'us')].append(r['median_us'])
        if 'x_floor_bound' in r: d[(r['dtype'],r['impl'],r['op'],n,'xfb')].append(r['x_floor_bound'])
for k in sorted(d): print(k, 'med %.3f [%.3f-%.3f]'%(st.median(d[k]),min(d[k]),max(d[k])), 'n=%d'%len(d[k]))
