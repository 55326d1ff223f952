"""Decomposes the f16 dq error of one element (row i, head h, dim d; keys lo..hi) into the
roundings of a FlashAttention-style kernel, and recomputes the oracle at f16 at that element
(the steps of attention.hpp / attention_backward.hpp, sequential float32 sums).
Usage: python decompose_element.py SUITE_DIR   (the tiny f16 --grad suite of seed 7)"""
import numpy as np, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_fa_backward import read, f16
SUITE = sys.argv[1]
def seqdot(a, b):
    """float32 dot product summed in index order (the oracle's loops)."""
    acc = np.float32(0)
    for x, y in zip(a, b): acc = np.float32(acc + np.float32(x) * np.float32(y))
    return acc
def analyse(name, i, h, d, lo, hi):
    """Prints the decomposition for element [i, h, d] of dq of case `name` (keys lo..hi of KV head h // 2)."""
    c, meta = read(f'{SUITE}/cases/{name}.safetensors'); e, em = read(f'{SUITE}/expected/{name}.safetensors')
    q, k, v, do = (c[n].astype(np.float64) for n in ('q', 'k', 'v', 'do'))
    D = q.shape[2]; s = 1 / np.sqrt(D); kv = h // 2
    K = k[lo:hi+1, kv]; V = v[lo:hi+1, kv]; qi = q[i, h]; doi = do[i, h]
    # float64 truth
    sc = s * K @ qi; p = np.exp(sc - sc.max()); p /= p.sum(); o = p @ V; dp = V @ doi; delta = doi @ o
    ds = p * (dp - delta); dq = s * ds @ K
    print(name, 'row', i, 'head', h, 'keys', hi-lo+1, 'p', p.round(4), 'dS', ds.round(5), 'sum|dS k_d|*s', s*np.abs(ds*K[:, d]).sum(), 'dq_d', dq[d], 'ref', e['dq'][i, h, d])
    # FA pieces (float32 math, roundings applied one at a time to the float64 truth)
    sc32 = np.float32(s) * (K.astype(np.float32) @ qi.astype(np.float32))
    m = sc32.max(); ex = np.exp(sc32 - m); l = ex.sum()
    o16 = f16((f16(ex) @ V.astype(np.float32)) / l); o32 = (ex @ V.astype(np.float32)) / l
    print('  o16 - o (delta part): d(delta)=%.3g -> dq err %.3g' % (doi @ o16 - delta, -s * (doi @ o16 - delta) * (p @ K)[d]))
    print('  of which P->f16 in the forward: d(delta)=%.3g' % (doi @ (f16((f16(ex) @ V.astype(np.float32)) / l) - f16(o32))))
    ds_fa = p * (dp - doi @ o16)
    print('  dS->f16: dq err %.3g' % (s * (f16(ds_fa) - ds_fa) @ K[:, d]))
    full = s * f16(ds_fa) @ K[:, d]
    print('  before final rounding err %.3g, after %.3g (ulp %.3g)' % (full - dq[d], f16(full) - dq[d], np.spacing(np.float16(full))))
    # oracle at X: s_j, P, dP, delta, dS rounded to f16; forward p rounded, o rounded
    scx = np.array([f16(np.float32(seqdot(qi, kk)) * np.float32(s)) for kk in K]).astype(np.float32)
    mx = scx.max(); lx = np.float32(0)
    for z in scx: lx = np.float32(lx + np.exp(np.float32(z - mx)))
    px = f16(np.exp(scx - mx) / lx); ox = f16(np.array([seqdot(px, V[:, dd]) for dd in range(D)]))
    lse = np.float32(mx + np.log(lx))
    pb = f16(np.exp(scx - lse)); dpx = f16(np.array([seqdot(doi, vv) for vv in V])); dx = f16(seqdot(doi, ox))
    dsx = f16(pb * (dpx - dx)); dqx = f16(np.float32(s) * seqdot(dsx, K[:, d]))
    print('  oracle at X: d(delta)=%.3g, dq err %.3g (file E_X %s)' % (dx - delta, dqx - dq[d], em['oracle_at_dtype_maxabs.dq']))
analyse('ragged_prefill_b0', 2, 1, 2, 0, 2)
analyse('ragged_decode_b0', 0, 1, 8, 0, 3)
