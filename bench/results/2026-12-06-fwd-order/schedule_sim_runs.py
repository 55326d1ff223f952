"""First version of schedule_sim.py (2026-12-06): the same static snake schedule and cost model,
with the base stream grouped in runs of L blocks (section 1 of ../2026-12-06-fwd-order.md). Prints
the makespan over the even load per (T, L) for x fastest per KV head ("sim"), then KV head
fastest ("sim2") and bands of X block indices ("sim3"). PT 8K at L = 2, x fastest: 2.32.
Usage: python3 schedule_sim_runs.py
"""
def sim(T, L, grid=132, hkv=8, ovh=1.0, snake=True, reuse=True):
    nb = (T*4+191)//192
    out_items=[]; 
    for x in range(nb):  # output, longest first
        rb = nb-1-x
        te=(48*rb+47)//64; out_items.append(te+1+ovh)
    base=[]
    for rb in range(nb):
        tb=max(0,(48*rb-127))//64; te=(48*rb+47)//64
        base.append((tb,te))
    runs=[]
    for r0 in range(0,nb,L):
        c=0; prev_te=-1
        for rb in range(r0,min(nb,r0+L)):
            tb,te=base[rb]
            c+= (te-tb+1)*0.6 + ovh   # compute per tile (fraction of an output tile: base tile partially masked)
        runs.append(c)
    items=[]
    for k in range(hkv): items += out_items + runs
    loads=[0.0]*grid
    n=len(items)
    r=0
    while r*grid < n:
        for pos in range(grid):
            p = grid-1-pos if (snake and r%2) else pos
            i=r*grid+pos
            if i<n: loads[p]+=items[i]
        r+=1
    tot=sum(items)
    return max(loads), tot/grid
for T in (8192, 32768, 131072):
    for L in (1,2,3,4,8,16):
        m,avg=sim(T,L)
        print(T,L,"makespan %.0f ideal %.0f ratio %.2f"%(m,avg,m/avg))
print("kvh fastest")
def sim2(T, L, grid=132, hkv=8, ovh=1.0, snake=True):
    nb = (T*4+191)//192
    out_items=[]
    for x in range(nb):
        rb = nb-1-x; te=(48*rb+47)//64; out_items.append(te+1+ovh)
    runs=[]
    for r0 in range(0,nb,L):
        c=0
        for rb in range(r0,min(nb,r0+L)):
            tb=max(0,(48*rb-127))//64; te=(48*rb+47)//64
            c+=(te-tb+1)*0.6+ovh
        runs.append(c)
    per=out_items+runs
    items=[]
    for x in range(len(per)):
        items += [per[x]]*hkv
    loads=[0.0]*grid; n=len(items); r=0
    while r*grid<n:
        for pos in range(grid):
            p=grid-1-pos if (snake and r%2) else pos
            i=r*grid+pos
            if i<n: loads[p]+=items[i]
        r+=1
    return max(loads), sum(items)/grid
for T in (8192, 32768, 131072):
    for L in (1,2,4,8):
        m,avg=sim2(T,L)
        print(T,L,"makespan %.0f ideal %.0f ratio %.3f"%(m,avg,m/avg))
print("bands")
def sim3(T, L, X, grid=132, hkv=8, ovh=1.0):
    nb = (T*4+191)//192
    per=[]
    for x in range(nb):
        rb=nb-1-x; te=(48*rb+47)//64; per.append(te+1+ovh)
    for r0 in range(0,nb,L):
        c=0
        for rb in range(r0,min(nb,r0+L)):
            tb=max(0,(48*rb-127))//64; te=(48*rb+47)//64
            c+=(te-tb+1)*0.6+ovh
        per.append(c)
    gx=len(per)
    items=[];kv=[]
    for b0 in range(0,gx,X):
        for k in range(hkv):
            for x in range(b0,min(gx,b0+X)):
                items.append(per[x]); kv.append(k)
    loads=[0.0]*grid; n=len(items); r=0; ws=0
    while r*grid<n:
        ks=set()
        for pos in range(grid):
            p=grid-1-pos if r%2 else pos
            i=r*grid+pos
            if i<n: loads[p]+=items[i]; ks.add(kv[i])
        ws=max(ws,len(ks)); r+=1
    return max(loads)/(sum(items)/grid), ws
for T in (8192, 32768, 131072):
    for X in (16, 33, 66, 132, 264):
        for L in (1,8):
            print(T,"X",X,"L",L,"ratio %.3f, max kvh per round %d"%sim3(T,L,X))
