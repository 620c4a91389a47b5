import json,glob,sys,statistics as st,collections
# per run: ubep send work / bsp token send work (same run), medians over runs per variant
O=sys.argv[1]; v=collections.defaultdict(list)
for f in sorted(glob.glob(O+'/[AB]-*.json')):
    n=f.split('/')[-1][0]; d=json.load(open(f)); res=d['results']
    def get(impl,op,dt,key):
        for r in res:
            if r['impl']==impl and r['op']==op and r['dtype']==dt: return r[key]
    for dt in sorted({r['dtype'] for r in res}):
        us=get('ubep','dispatch',dt,'stages_us'); bs=get('bsp','dispatch',dt,'stages_us')
        if not us or not bs: continue
        v[(dt,n,'ubep send/bsp token send')].append(us['send']/bs['token send'])
        v[(dt,n,'ubep op/bsp op')].append(get('ubep','dispatch',dt,'median_us')/get('bsp','dispatch',dt,'median_us'))
        v[(dt,n,'ubep send us')].append(us['send'])
for k in sorted(v): print(k,'med %.3f [%.3f-%.3f]'%(st.median(v[k]),min(v[k]),max(v[k])),len(v[k]))
