"""Does the simulated kernel (sim_fa_backward.py) reproduce the H200 libraries? Compares its max
abs error per (case, gradient tensor) with the `orthros check --json` reports of run3
(bench/results/2026-12-02-h200-ports/run3/reports.tar.xz, unpacked into REPORTS).
Usage: [SIM_DTYPE=bf16] python compare_reports.py REPORTS SUITE_DIR CFG   (SUITE_DIR: the suite
written with `orthros golden --grad --dtype DTYPE --config CFG --seed 7`, as run3 used)"""
import json, os, sys, numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_fa_backward import read, fa_case, ROUND_TO
reports, suite, cfg = sys.argv[1:4]
libs = ('flex', 'cudnn', 'flash')
rep = {lib: json.load(open(os.path.join(reports, 'ports', lib, f'op-grad-{cfg}-{ROUND_TO}.json'))) for lib in libs}
errs = {}
for lib in libs:
    for c in rep[lib]['cases']:
        for t in c.get('tensors', []):
            errs.setdefault((c['name'], t['name']), {})[lib] = t['max_abs']
agree = {(lib, g): 0 for lib in libs for g in ('dq', 'dkv')}; total = {'dq': 0, 'dkv': 0}
for case in sorted(os.listdir(os.path.join(suite, 'cases'))):
    name = case[:-12]
    c, meta = read(os.path.join(suite, 'cases', case))
    if 'do' not in c: continue
    e, em = read(os.path.join(suite, 'expected', case)); r = fa_case(c, meta)
    for t in ('dq', 'dq_out', 'dk', 'dv'):
        if e[t].size == 0 or (name, t) not in errs: continue
        err = float(np.abs(r[t].astype(np.float64) - e[t].reshape(r[t].shape)).max())
        grp = 'dq' if t.startswith('dq') else 'dkv'; total[grp] += 1
        for lib, v in errs[(name, t)].items(): agree[(lib, grp)] += abs(err - v) <= 1e-3 * v + 1e-12
        if name.startswith('ragged') and t == 'dq':
            print('%s %s sim %.6g  ' % (name, t, err) + '  '.join('%s %.6g' % kv for kv in errs[(name, t)].items()))
for grp, what in (('dq', 'dq/dq_out'), ('dkv', 'dk/dv')):
    print('%s %s %s: simulated max abs error equal (within 0.1%%) to the report on %s of %d case-tensors' % (
        cfg, ROUND_TO, what, ', '.join('%s %d' % (lib, agree[(lib, grp)]) for lib in libs), total[grp]))
