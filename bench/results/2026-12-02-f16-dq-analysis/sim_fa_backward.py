"""A FlashAttention-2 / cuDNN style f16 (SIM_DTYPE=bf16: bf16) forward + backward simulated in NumPy (float32
accumulation), judged against an `orthros golden --grad` suite of that dtype: its float64 gradients and the
SPEC §6 max-abs bound 2 E_X + 1e-6 (E_X read from the expected files).

Usage: python sim_fa_backward.py SUITE_DIR [CASE ...]
Prints, per case, max abs error / bound of dq, dq_out, dk, dv (FAIL where above).
Roundings to f16 (everything else float32): the forward's unnormalized exp(s - m) before P V,
o; the backward's P before P^T dO, dS = P (dP - delta) before dS K and dS^T Q, with
delta = rowsum(dO * o_f16); dq, dk, dv at the end. Both streams are summed into dk/dv in one
pass (one fused backward, as FlexAttention)."""
import json, struct, sys, os
import numpy as np

def read(path):
    """Tensors (NumPy, file dtype) and __metadata__ of a safetensors file (F16/F32/F64)."""
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        h = json.loads(f.read(n)); buf = f.read()
    meta = h.pop('__metadata__', {})
    dt = {'F16': np.float16, 'F32': np.float32, 'F64': np.float64, 'BF16': np.uint16}
    out = {}
    for k, v in h.items():
        a, b = v['data_offsets']
        x = np.frombuffer(buf[a:b], dtype=dt[v['dtype']]).reshape(v['shape'])
        out[k] = (x.astype(np.uint32) << 16).view(np.float32) if v['dtype'] == 'BF16' else x
    return out, meta

def _bf16(x):
    """float32 -> nearest bfloat16 (ties to even), returned as float32 (finite inputs)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    one, sh = np.uint64(1), np.uint64(16)
    b = (b + np.uint64(0x7FFF) + ((b >> sh) & one)) & np.uint64(0xFFFF0000)
    return b.astype(np.uint32).view(np.float32)

def f16(x):
    """Rounds float32 values to the dtype under test (ROUND_TO: 'f16' or 'bf16'), as float32."""
    if ROUND_TO == 'bf16': return _bf16(x)
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)

ROUND_TO = os.environ.get('SIM_DTYPE', 'f16')

def rows(P, T, T_out, w):
    base = [(max(0, P + i - w + 1), P + i) for i in range(T)]
    out = [(0, P + T - T_out + i) for i in range(T_out)]
    return base, out

def fa_case(c, meta, round_p_fwd=True, round_ds=True, round_p_bwd=True):
    """Gradients of one case (arrays of read()) with the module's roundings; the flags turn
    single roundings off to attribute an error. Returns dq, dq_out, dk, dv (f16 values as f32)."""
    q, k, v, qo, do, doo = (c[n].astype(np.float32) for n in ('q', 'k', 'v', 'q_out', 'do', 'do_out'))
    T, Hq, D = q.shape; N, Hkv, _ = k.shape; P = N - T; T_out = qo.shape[0]; g = Hq // Hkv
    w = int(meta['window']); s = np.float32(float(meta['scale']) if 'scale' in meta else 1 / np.sqrt(D))
    base, outr = rows(P, T, T_out, w)
    res = {'dq': np.zeros_like(q), 'dq_out': np.zeros_like(qo), 'dk': np.zeros((N, Hkv, D), np.float32),
           'dv': np.zeros((N, Hkv, D), np.float32)}
    for qq, dd, rr, name in ((q, do, base, 'dq'), (qo, doo, outr, 'dq_out')):
        for i, (lo, hi) in enumerate(rr):
            for h in range(Hq):
                kv = h // g
                K = k[lo:hi + 1, kv]; V = v[lo:hi + 1, kv]
                sc = (K @ qq[i, h]).astype(np.float32) * s
                m = sc.max(); e = np.exp(sc - m).astype(np.float32); l = e.sum(dtype=np.float32)
                ep = f16(e) if round_p_fwd else e
                o16 = f16((ep @ V) / l)
                lse = np.float32(m + np.log(l))
                p = np.exp(sc - lse).astype(np.float32)
                dp = (V @ dd[i, h]).astype(np.float32)
                delta = np.float32(np.dot(dd[i, h], o16))
                ds = p * (dp - delta)
                ds16 = f16(ds) if round_ds else ds
                p16 = f16(p) if round_p_bwd else p
                res[name][i, h] = s * (ds16 @ K)
                res['dk'][lo:hi + 1, kv] += s * np.outer(ds16, qq[i, h])
                res['dv'][lo:hi + 1, kv] += np.outer(p16, dd[i, h])
    return {n: f16(a) for n, a in res.items()}

if __name__ == '__main__':
    suite = sys.argv[1]; only = sys.argv[2:] or None
    man = json.load(open(os.path.join(suite, 'manifest.json')))
    for case in sorted(os.listdir(os.path.join(suite, 'cases'))):
        name = case[:-12]
        if only and name not in only: continue
        c, meta = read(os.path.join(suite, 'cases', case))
        if 'do' not in c: continue
        e, em = read(os.path.join(suite, 'expected', case))
        r = fa_case(c, meta)
        line = []
        for t in ('dq', 'dq_out', 'dk', 'dv'):
            if e[t].size == 0: continue
            ex = float(em['oracle_at_dtype_maxabs.' + t]) if em['oracle_at_dtype_maxabs.' + t] != 'n/a' else float('nan')
            err = np.abs(r[t].astype(np.float64) - e[t].reshape(r[t].shape)).max()
            b = 2 * ex + 1e-6
            line.append('%s %.3g/%.3g%s' % (t, err, b, ' FAIL' if err > b else ''))
        print(name, ' | '.join(line))
