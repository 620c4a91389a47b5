import json,sys,glob,os,statistics as st
# usage: pr.py DIR binA binB : pair ratios of B over A per (impl,op,dtype) median_us
d,a,b=sys.argv[1:4]
def load(f):
    j=json.load(open(f)); rows=j['results']
    out={}
    for r in rows:
        k=(r.get('impl'),r.get('op'),r.get('dtype',''),r.get('workload',''))
        out[k]=r.get('median_us')
    return out
i=1; res={}
while os.path.exists(f'{d}/{a}-{i}.json') and os.path.exists(f'{d}/{b}-{i}.json'):
    A=load(f'{d}/{a}-{i}.json'); B=load(f'{d}/{b}-{i}.json')
    for k in A:
        if k in B and A[k]: res.setdefault(k,[]).append((A[k],B[k]))
    i+=1
for k,v in sorted(res.items(),key=lambda x:str(x[0])):
    rs=[y/x for x,y in v]
    print(k, 'A', ' '.join(f'{x:.0f}' for x,_ in v), '| B', ' '.join(f'{y:.0f}' for _,y in v), '| ratio med %.3f faster %d/%d'%(st.median(rs), sum(r<1 for r in rs), len(rs)))
