"""Summary of a sweep_seeds.py dump: per gradient tensor the ratio err / E_X (median, p90, p99,
max) and the failures of 2 E_X + 1e-6; failures by case; the largest ratio by tensor size.
Usage: python summarize_sweep.py SWEEP.json"""
import json, sys, collections, numpy as np
r = json.load(open(sys.argv[1]))
seeds = sorted(set(x['seed'] for x in r))
print('seeds', len(seeds), 'case-tensor pairs', len(r))
by_t = collections.defaultdict(list)
for x in r: by_t[x['t']].append(x)
for t, xs in by_t.items():
    ratio = np.array([x['err'] / x['ex'] for x in xs if x['ex'] > 0])
    fails = [x for x in xs if not x['ok']]
    print('%-6s n=%5d  ratio err/E_X: median %.2f p90 %.2f p99 %.2f max %.2f  fail %d (%.2f%%)' % (
        t, len(ratio), np.median(ratio), np.percentile(ratio, 90), np.percentile(ratio, 99), ratio.max(), len(fails), 100 * len(fails) / len(xs)))
suites_fail = collections.Counter(x['seed'] for x in r if not x['ok'])
print('suites (seeds) with >= 1 failing case-tensor: %d of %d' % (len(suites_fail), len(seeds)))
bycase = collections.Counter(x['case'] for x in r if not x['ok'])
print('failing cases:', bycase.most_common())
# ratio vs tensor size
sizes = collections.defaultdict(list)
for x in r:
    if x['ex'] > 0: sizes[x['n']].append(x['err'] / x['ex'])
for n in sorted(sizes):
    a = np.array(sizes[n]); print('  elements %6d: pairs %4d, max ratio %.2f, ratio > 2: %d' % (n, len(a), a.max(), (a > 2).sum()))
