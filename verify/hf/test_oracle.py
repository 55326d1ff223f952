"""The converted torch model and the C++ oracle on the same saved weights (orthros.torch.save_for_oracle
-> the oracle's model file) agree on logits and on one training step's loss and parameter
gradients, PT and SFT; `orthros verify --weights` runs every regime of the converted checkpoint
through the oracle, bitwise equal to PT.

Bound: SPEC §6 per tensor (hf_cases): the torch model in float32 against the float64 oracle, with
E = the oracle-at-float32's max abs error on that tensor. A tied LM head's gradient is the sum of
the oracle's `embedding` gradient and the transpose of its `lm_head` gradient (one parameter, two
uses), compared with E summed likewise.
"""
import subprocess

import pytest
import torch

from hf_cases import ARCHS, Oracle, converted, orthros_exe, spec6, tokens

from orthros.torch import oracle_file


def _step(model, ids, labels):
    model.zero_grad()
    out = model(ids[None], labels=labels[None])
    out.loss.backward()
    return out, {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("regime", ["PT", "SFT"])
def test_torch_and_oracle_agree_on_logits_loss_and_gradients(arch, regime):
    seed = 51 if regime == "PT" else 52
    model = converted(arch, seed, window=4)
    T, response = 14, 5
    seq = tokens(seed, (T + 1,))
    ids, labels = seq[:T], seq[:T].clone()
    if regime == "SFT":
        labels[:T - response + 1] = -100         # positions T-response..T-1 predict the response
        t_out = response
    else:
        t_out = T
    targets = seq[T - t_out + 1:T + 1]            # next token of each predicting position
    out, grads = _step(model, ids, labels)
    assert out.logits.shape[1] == t_out
    # The torch loss averages positions T-T_out..T-2 (the last position has no label inside
    # input_ids); the last base token and its output token then add nothing to the loss, so the
    # oracle's step on the first T-1 tokens with those T_out-1 targets is the same function.
    oracle = Oracle(model)
    F, E = oracle.logits(ids.tolist(), t_out=t_out)
    spec6(f"{arch} {regime} logits", out.logits[0], F, E)
    step = dict(t_out=t_out - 1, targets=targets[:-1].tolist())
    r64 = oracle.run(ids[:T - 1].tolist(), **step)
    r32 = oracle.run(ids[:T - 1].tolist(), dtype="f32", **step)  # E of every gradient
    # Loss: each of the n cross-entropy terms moves by at most ||softmax - onehot||_1 * max|dz|
    # <= 2 max|dz| (mean value theorem) for logit errors dz; plus the float32 rounding of the mean of
    # n positive terms (<= n u |loss|) and of each log-sum-exp (a few u |loss|), u = 2^-24.
    n, loss64 = t_out - 1, r64["loss"].item()
    dz = (out.logits[0].double() - F).abs().max().item()
    tol = 2 * dz + (n + 4) * 2.0 ** -24 * max(abs(loss64), 1.0)
    assert abs(out.loss.item() - loss64) <= tol, f"loss {out.loss.item()} vs oracle {loss64} (bound {tol:.3g})"
    g64, g32 = oracle_file.torch_gradients(model, r64), oracle_file.torch_gradients(model, r32)
    assert set(g64) == set(grads)
    for name, g in grads.items():
        e = (g32[name] - g64[name]).abs().max().item()
        spec6(f"{arch} {regime} grad {name}", g, g64[name], e)


def test_verify_runs_every_regime_of_a_converted_checkpoint(tmp_path):
    model = converted("qwen3", 61, window=6)
    weights = tmp_path / "converted.safetensors"
    oracle_file.save_for_oracle(model, weights)
    r = subprocess.run([orthros_exe(), "verify", "--weights", str(weights), "--seq-len", "24"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS: all 10 regimes bitwise equal to PT" in r.stdout, r.stdout
    assert "(H_q=4 H_kv=2 D=8 w=6 theta=1e+06 qk_norm=yes) d_model=24 layers=2" in r.stdout, r.stdout


def test_model_command_names_bad_input(tmp_path):
    model = converted("llama", 62, window=4)
    weights = tmp_path / "m.safetensors"
    oracle_file.save_for_oracle(model, weights)
    exe, out = orthros_exe(), tmp_path / "r.safetensors"
    import orthros.torch as ot
    with pytest.raises(ot.Error, match=r"token id 96 outside \[0, 96\)"):
        oracle_file.run_oracle_model(exe, weights, [1, 96, 2], out)
    with pytest.raises(ot.Error, match="--targets must hold T_out = 2 next-token ids"):
        oracle_file.run_oracle_model(exe, weights, [1, 2, 3], out, t_out=2, targets=[4])
    with pytest.raises(ot.Error, match=r"--t-out must be in \[1, T = 3\]"):
        oracle_file.run_oracle_model(exe, weights, [1, 2, 3], out, t_out=4)
    other = tmp_path / "case.safetensors"
    from safetensors.torch import save_file
    save_file({"q": torch.ones(1, 1, 2)}, str(other))  # an attention case, not a model
    with pytest.raises(ot.Error, match="orthros_model"):
        oracle_file.run_oracle_model(exe, other, [1], out)
