"""A candidate first-order floor for dq / dq_out in f16, evaluated on golden suites (not used by
the checker). Per element (row, head, dim d), u = 2^-11, float64 quantities of the case:

    G_d = u * ( s |kbar_d| * sum_e |dO_e| (|o_e| + sum_j p_j |v_je|)    delta from o rounded (and P in P V)
              + s * sum_j |dS_j| |k_jd|                               dS rounded before dS K
              + |dq_d| )                                               dq rounded

(kbar = sum_j p_j k_j). Prints per case max_d G_d (the candidate addend of the bound), E_X and
the simulated kernel's error.
Usage: python floor_candidate.py SWEEP.json WORK CFG   (WORK and CFG as given to sweep_seeds.py)"""
import json, os, sys, collections, numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_fa_backward import read, rows

def floor_dq(c, meta):
    q, k, v, qo, do, doo = (c[n].astype(np.float64) for n in ('q', 'k', 'v', 'q_out', 'do', 'do_out'))
    T, Hq, D = q.shape; N, Hkv, _ = k.shape; P = N - T; g = Hq // Hkv
    w = int(meta['window']); s = float(meta['scale']) if 'scale' in meta else 1 / np.sqrt(D)
    base, outr = rows(P, T, qo.shape[0], w); u = 2.0 ** -11; out = {}
    for qq, dd, rr, name in ((q, do, base, 'dq'), (qo, doo, outr, 'dq_out')):
        G = 0.0
        for i, (lo, hi) in enumerate(rr):
            for h in range(Hq):
                K = k[lo:hi + 1, h // g]; V = v[lo:hi + 1, h // g]
                sc = s * K @ qq[i, h]; p = np.exp(sc - sc.max()); p /= p.sum()
                o = p @ V; dp = V @ dd[i, h]; ds = p * (dp - dd[i, h] @ o); dq = s * ds @ K
                term = s * np.abs(p @ K) * (np.abs(dd[i, h]) @ (np.abs(o) + p @ np.abs(V))) \
                    + s * np.abs(ds) @ np.abs(K) + np.abs(dq)
                G = max(G, u * term.max())
        out[name] = G
    return out

if __name__ == '__main__':
    r = json.load(open(sys.argv[1])); work, cfg = sys.argv[2], sys.argv[3]
    want = {(x['seed'], x['case']) for x in r if x['t'] in ('dq', 'dq_out')}
    cache = {}; ratios = collections.defaultdict(list); bad = []
    for x in r:
        if x['t'] not in ('dq', 'dq_out') or x['ex'] == 0: continue
        key = (x['seed'], x['case'])
        if key not in cache:
            c, meta = read(os.path.join(work, '%s-%d' % (cfg, x['seed']), 'cases', x['case'] + '.safetensors'))
            cache[key] = floor_dq(c, meta)
        G = cache[key][x['t']]
        ratios[x['t']].append(G / x['ex'])
        if x['err'] > 2 * x['ex'] + 1e-6 + G: bad.append(x)
        if not x['ok']: print('failing now: seed %d %s %s err %.3g E_X %.3g G %.3g -> bound %.3g' % (
            x['seed'], x['case'], x['t'], x['err'], x['ex'], G, 2 * x['ex'] + 1e-6 + G))
    for t, a in ratios.items():
        a = np.array(a); print('%s: G / E_X median %.2f p10 %.2f max %.2f over %d case-tensors' % (t, np.median(a), np.percentile(a, 10), a.max(), len(a)))
    print('simulated kernel above 2 E_X + 1e-6 + G:', len(bad))
