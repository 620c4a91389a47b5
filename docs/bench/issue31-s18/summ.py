import json,glob,sys,collections,statistics as st
D=sys.argv[1]
rows=collections.defaultdict(list)
for f in sorted(glob.glob(D+'/*.json')):
    v,i=f.split('/')[-1][:-5].rsplit('-',1)
    res=json.load(open(f))['results']
    for r in res:
        if r['impl'] in('ubep','bsp'):
            rows[(v,r['dtype'],r['impl'],r['op'])].append((int(i),r['median_us'],r['x_bound']))
for k in sorted(rows):
    L=sorted(rows[k]); print(k, 'med %.0f'%st.median(x[1] for x in L),' '.join('%d:%.0f(%.3f)'%x for x in L))
