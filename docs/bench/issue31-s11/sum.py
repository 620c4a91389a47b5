import json,glob,sys,statistics as st,collections
O=sys.argv[1]; v=collections.defaultdict(list)
for f in sorted(glob.glob(O+'/[AB]-*.json')):
    n=f.split('/')[-1][0]; d=json.load(open(f))
    for r in d['results']:
        if r['op']!='dispatch' or r['impl'] not in ('ubep','bsp','bound'): continue
        k=(r['dtype'],r['impl'],n)
        v[k+('us',)].append(r['median_us'])
        if r['impl']!='bound': v[k+('xb',)].append(r['x_bound']); v[k+('read',)].append(r.get('expert_read_us') or 0)
for k in sorted(v): print(k, 'med %.2f [%.2f-%.2f]'%(st.median(v[k]),min(v[k]),max(v[k])))
