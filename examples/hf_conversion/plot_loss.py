"""Plots gpu_bench.py's loss_curve.csv (step, one column per model) as a PNG:
    python3 plot_loss.py LOSS_CSV OUT_PNG [TITLE]"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = list(csv.reader(open(sys.argv[1])))
names, data = rows[0][1:], [[float(v) for v in r[1:]] for r in rows[1:]]
fig, ax = plt.subplots(figsize=(6.4, 4))
for i, n in enumerate(names):
    ax.plot([r[i] for r in data], label=n, lw=1)
ax.set_xlabel("step")
ax.set_ylabel("next-token loss (nats)")
if len(sys.argv) > 3:
    ax.set_title(sys.argv[3], fontsize=9)
ax.legend()
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=120)
