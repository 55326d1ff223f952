"""Simulation of the Hopper forward kernel's static schedule (2026-12-06).

The persistent kernel deals work item round * grid + pos to CTA pos (snake order: reversed on odd
rounds). An item is one 192-row block; its cost is modelled as its K/V tiles (64 keys) plus one
tile of fixed overhead, base-stream tiles counted at 0.6 (partly masked). The script prints each
order's makespan over the even load (1.000 = perfectly even) for the orders split_item can deal:
b0 = one band per KV head (x fastest, the order before 2026-12-06; note that ORTHROS_FWD_BAND=0
selects the kernel's default instead, and a band >= gx forces this order), b1 = KV head fastest,
bN = bands of N block indices (132 SMs: N = 33 is the default, 4 bands per round).
Usage: python3 schedule_sim.py
"""
def costs(T, Tout, group=4, ovh=1.0):
    BM=192; tpb=BM/group
    nbo=(Tout*group+BM-1)//BM; nbb=(T*group+BM-1)//BM
    per=[]
    for x in range(nbo):
        rb=nbo-1-x; last=min(Tout*group, (rb+1)*BM)-1; pos=T-Tout+last//group
        per.append(pos//64+1+ovh)
    for rb in range(nbb):
        f=rb*BM//group; l=(min(T*group,(rb+1)*BM)-1)//group
        per.append(((l//64)-max(0,f-127)//64+1)*0.6+ovh)
    return per
def sim(per, hkv, band, grid=132):
    gx=len(per); b=gx if band==0 else min(band,gx); nb=(gx+b-1)//b
    items=[]
    for bi in range(nb):
        for k in range(hkv):
            for xo in range(b):
                x=bi*b+xo
                items.append(per[x] if x<gx else 0.0)
    loads=[0.0]*grid; r=0; n=len(items)
    while r*grid<n:
        for pos in range(grid):
            p=grid-1-pos if r%2 else pos
            i=r*grid+pos
            if i<n: loads[p]+=items[i]
        r+=1
    return max(loads)/(sum(items)/grid)
for hkv,group in ((8,4),(2,4),(8,1),(4,8)):
  for T,Tout in ((4096,4096),(8192,8192),(16384,16384),(32768,32768),(8192,2048),(32768,8192)):
    per=costs(T,Tout,group)
    print("hkv",hkv,"g",group,T,Tout," ".join("b%d:%.3f"%(b,sim(per,hkv,b)) for b in (0,1,16,33,66)))
