import json,glob,statistics as st,sys
D=sys.argv[1]
def get(f):
    out={}
    for r in json.load(open(f))['results']:
        out[(r['impl'],r['op'],r['dtype'])]=r['median_us']
    return out
n=len(glob.glob(D+'/A-*.json'))
for key in [('ubep','dispatch','bf16'),('ubep','dispatch','fp8'),('ubep','combine','bf16'),('ubep','combine','fp8'),('bsp','dispatch','bf16'),('bsp','dispatch','fp8')]:
    rs=[]
    for i in range(1,n+1):
        try: a=get(f'{D}/A-{i}.json'); b=get(f'{D}/B-{i}.json')
        except Exception: continue
        if key in a and key in b: rs.append(b[key]/a[key])
    if rs: print(key,'pair ratio med %.3f'%st.median(rs),'faster %d/%d'%(sum(r<1 for r in rs),len(rs)),['%.3f'%r for r in rs])
for side in 'AB':
    rr=[]
    for i in range(1,n+1):
        try: a=get(f'{D}/{side}-{i}.json')
        except Exception: continue
        rr.append(a[('ubep','dispatch','fp8')]/a[('ubep','dispatch','bf16')])
    print(side,'fp8/bf16 ubep dispatch med %.3f'%st.median(rr),['%.3f'%r for r in rr])
