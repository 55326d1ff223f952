"""Training a converted model through autograd on the orthros ops (CPU: the oracle-backed ops):
the SFT loss (-100 labels, T_out = the response) equals the PT graph's loss masked to the same
labels, with the same gradients (SPEC §4: the output tokens outside the loss add nothing); a
batch of sequences trains (loss falls); a dtype the CPU ops do not run is refused by name.

Bounds as hf_cases: each variant's gradients within SPEC §6 of the float64 oracle's SFT step.
"""
import pytest
import torch

from hf_cases import ARCHS, Oracle, converted, pair_bound, spec6, tokens

from orthros.torch import oracle_file


@pytest.mark.parametrize("arch", ARCHS)
def test_sft_equals_pt_masked_to_the_response(arch):
    seed, T, response = 71, 16, 6
    model = converted(arch, seed, window=5)
    seq = tokens(seed, (T,))
    labels = seq.clone()
    labels[:T - response] = -100
    results, logits = {}, {}
    for name, kw in (("SFT", {}), ("PT masked", {"num_output_tokens": T})):
        model.zero_grad()
        out = model(seq[None], labels=labels[None], **kw)
        out.loss.backward()
        results[name] = (out.loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()})
        logits[name] = out.logits[0, -(response + 1):].detach()
    # Same loss: the n = response terms come from the same positions' logits; each term moves by at
    # most 2 max|dz| (its gradient in the logits has L1 norm <= 2) plus the float32 rounding of the
    # mean and log-sum-exps ((n + 4) u |loss|, u = 2^-24).
    dz = (logits["SFT"] - logits["PT masked"]).abs().max().item()
    tol = 2 * dz + (response + 4) * 2.0 ** -24 * max(abs(results["SFT"][0]), 1.0)
    assert abs(results["SFT"][0] - results["PT masked"][0]) <= tol, (results["SFT"][0], results["PT masked"][0], tol)
    # oracle SFT step: positions T-response-1 .. T-2 predict labels T-response .. T-1 (first T-1 tokens)
    oracle = Oracle(model)
    step = dict(t_out=response, targets=seq[T - response:].tolist())
    g64 = oracle_file.torch_gradients(model, oracle.run(seq[:T - 1].tolist(), **step))
    g32 = oracle_file.torch_gradients(model, oracle.run(seq[:T - 1].tolist(), dtype="f32", **step))
    for name, (_, grads) in results.items():
        for p, g in grads.items():
            e = (g32[p] - g64[p]).abs().max().item()
            spec6(f"{arch} {name} grad {p}", g, g64[p], e)
    worst = max((results["SFT"][1][p] - results["PT masked"][1][p]).abs().max().item() for p in g64)
    bound = min(pair_bound((g32[p] - g64[p]).abs().max().item()) for p in g64)
    print(f"{arch}: max |SFT grad - PT-masked grad| {worst:.3g} (each within SPEC 6 of the oracle; "
          f"tightest pair bound {bound:.3g})")


@pytest.mark.parametrize("arch", ARCHS)
def test_a_batch_trains(arch):
    torch.manual_seed(81)
    model = converted(arch, 81, window=4)
    batch = tokens(81, (3, 12))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        opt.zero_grad()
        loss = model(batch, labels=batch).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # 3 x 11 next-token targets over 96 tokens: a model with ~1e4 parameters memorises them; a
    # broken gradient (wrong sign, lost stream, detached op) does not bring the loss down this far.
    assert losses[-1] < 0.5 * losses[0], f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_cpu_bfloat16_is_refused_by_name():
    model = converted("llama", 1, window=4)
    model.to(torch.bfloat16)
    with pytest.raises(Exception, match="bfloat16|dtype"):
        model(tokens(1, (1, 6)))
