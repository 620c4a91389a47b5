import json,glob,statistics as st,sys
D=sys.argv[1]
def get(f):
    return {(r['impl'],r['op'],r['dtype']):(r['median_us'],r.get('x_bound',0)) for r in json.load(open(f))['results']}
n=len(glob.glob(D+'/A-*.json'))
keys=set()
for f in glob.glob(D+'/A-*.json'): keys|=set(k for k in get(f) if k[0] in('ubep','bsp'))
for key in sorted(keys):
    rs=[];xa=[];xb=[]
    for i in range(1,n+1):
        try: a=get(f'{D}/A-{i}.json'); b=get(f'{D}/B-{i}.json')
        except Exception: continue
        if key in a and key in b: rs.append(b[key][0]/a[key][0]); xa.append(a[key][1]); xb.append(b[key][1])
    if rs: print(key,'B/A med %.3f'%st.median(rs),['%.3f'%r for r in rs],'xbound A %.3f B %.3f'%(st.median(xa),st.median(xb)))
