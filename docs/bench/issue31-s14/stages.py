import json,glob,sys,statistics as st,collections
d=collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1]+'/[AB]-*.json')):
    n=f.split('/')[-1][0]; res=json.load(open(f))['results']
    for r in res:
        if r['impl'] not in ('ubep','bsp') or r['op']!='dispatch': continue
        for s,v in r['stages_us'].items(): d[(r['dtype'],r['impl'],s,n)].append(v)
for k in sorted(d): print(k, 'med %.3f [%.3f-%.3f]'%(st.median(d[k]),min(d[k]),max(d[k])), 'n=%d'%len(d[k]))
