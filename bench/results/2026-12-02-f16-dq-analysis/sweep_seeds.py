"""Seed sweep: writes `orthros golden --grad --dtype f16 --config CFG --seed S` for S in
[FIRST, LAST) under WORK/CFG-S (kept), runs sim_fa_backward on each case and dumps one row per
(seed, case, gradient tensor): elements n, the simulated kernel's max abs error err, E_X, and
whether err <= 2 E_X + 1e-6.

Usage: ORTHROS=build/reference/orthros python sweep_seeds.py CFG FIRST LAST OUT.json WORK [CASE ...]"""
import json, os, sys, subprocess, numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_fa_backward import read, fa_case
cfg, seeds, outf, work = sys.argv[1], range(int(sys.argv[2]), int(sys.argv[3])), sys.argv[4], sys.argv[5]
only = sys.argv[6:] or None
orthros = os.environ.get('ORTHROS', 'orthros')
rows = []
for sd in seeds:
    d = os.path.join(work, f'{cfg}-{sd}')
    if not os.path.exists(d + '/manifest.json'):
        subprocess.run([orthros, 'golden', '--grad', '--dtype', os.environ.get('SIM_DTYPE', 'f16'), '--config', cfg,
                        '--seed', str(sd), '--out', d], check=True, stdout=subprocess.DEVNULL)
    for case in sorted(os.listdir(d + '/cases')):
        name = case[:-12]
        if only and name not in only: continue
        c, meta = read(f'{d}/cases/{case}')
        if 'do' not in c: continue
        e, em = read(f'{d}/expected/{case}')
        r = fa_case(c, meta)
        for t in ('dq', 'dq_out', 'dk', 'dv'):
            if e[t].size == 0 or em['oracle_at_dtype_maxabs.' + t] == 'n/a': continue
            ex = float(em['oracle_at_dtype_maxabs.' + t])
            err = float(np.abs(r[t].astype(np.float64) - e[t].reshape(r[t].shape)).max())
            rows.append(dict(seed=sd, case=name, t=t, n=int(e[t].size), err=err, ex=ex, ok=err <= 2 * ex + 1e-6))
    json.dump(rows, open(outf, 'w'))
