"""A converted model's weights as the C++ oracle's model file (docs/file-format.md, "Model weights";
verify/kit/include/orthros/model_io.hpp), so `orthros verify --weights FILE` runs every regime of
the checkpoint through the readable oracle and `orthros model --weights FILE` gives its logits and
one training step's gradients for a cross-check."""
import subprocess

import torch

from .. import _core

Error = _core.Error


def oracle_parameters(model):
    """[(oracle name, torch parameter, transposed)] for every tensor of the model file, in the
    oracle's names (training.hpp for_each_parameter) and layout (`x @ W`: a torch.nn.Linear weight
    [out, in] is stored transposed). A tied LM head appears twice (`embedding` and `lm_head`, the
    same parameter): its gradient is the sum of the two oracle gradients (see torch_gradients)."""
    hf = model.hf
    out = [("embedding", hf.model.embed_tokens.weight, False)]
    for l, layer in enumerate(model.layers):
        a = layer.self_attn.attn
        p = f"layers.{l}."
        out.append((p + "attn_norm", layer.input_layernorm.weight, False))
        for n in ("w_q", "w_k", "w_v", "w_o", "alpha", "beta", "alpha_out", "beta_out"):
            out.append((p + "attn." + n, getattr(a, n), False))
        if a.qk_norm:
            out += [(p + "attn.q_norm", a.q_norm, False), (p + "attn.k_norm", a.k_norm, False)]
        out.append((p + "ffn_norm", layer.post_attention_layernorm.weight, False))
        out += [(p + "w_gate", layer.mlp.gate_proj.weight, True), (p + "w_up", layer.mlp.up_proj.weight, True),
                (p + "w_down", layer.mlp.down_proj.weight, True)]
    out += [("final_norm", hf.model.norm.weight, False), ("lm_head", hf.lm_head.weight, True)]
    return out


def oracle_metadata(model):
    """The model file's `__metadata__` (model_io.hpp) of a converted model."""
    cfg = model.config
    a = model.orthros_attention(0)
    eps = {float(cfg.rms_norm_eps), float(a.rms_eps)}
    if len(eps) != 1:
        raise Error(f"the oracle's model file has one RMSNorm epsilon; this model uses {sorted(eps)}")
    return {"orthros_model": "1", "vocab_size": str(cfg.vocab_size), "d_model": str(cfg.hidden_size),
            "d_ff": str(cfg.intermediate_size), "num_layers": str(len(model.layers)),
            "num_q_heads": str(a.num_q_heads), "num_kv_heads": str(a.num_kv_heads), "head_dim": str(a.head_dim),
            "window": str(a.window), "rope_theta": repr(float(a.rope_theta)), "rms_eps": repr(eps.pop()),
            "qk_norm": "true" if a.qk_norm else "false", "source": type(model.hf).__name__}


def save_for_oracle(model, path, dtype=torch.float64):
    """Writes a converted model (OrthrosForCausalLM) as the oracle's model file at `path`
    (safetensors; tensors in `dtype`, float64 by default: widening a float32 model is exact).
    Raises orthros.Error when the model cannot be expressed in the file format."""
    from safetensors.torch import save_file
    tensors = {}
    for name, p, transposed in oracle_parameters(model):
        t = p.detach().to(device="cpu", dtype=dtype)
        tensors[name] = (t.t() if transposed else t).contiguous().clone()
    save_file(tensors, str(path), metadata=oracle_metadata(model))


def torch_gradients(model, oracle_result):
    """The oracle's `grad.<name>` tensors of an `orthros model --targets` result (a file path or
    its tensors as run_oracle_model returns them), mapped onto the model's parameters:
    {torch parameter name: gradient in the parameter's layout (float64)}, tied parameters summed
    over their oracle names."""
    from safetensors.torch import load
    if isinstance(oracle_result, dict):
        r = oracle_result
    else:
        with open(oracle_result, "rb") as f:
            r = load(f.read())
    names = {id(p): n for n, p in model.named_parameters()}
    grads = {}
    for name, p, transposed in oracle_parameters(model):
        g = r["grad." + name].to(torch.float64)
        g = g.t() if transposed else g
        key = names[id(p)]
        grads[key] = grads[key] + g if key in grads else g
    return grads


def run_oracle_model(orthros_exe, weights, tokens, out, *, t_out=None, targets=None, dtype="f64"):
    """Runs `orthros model` (verify/cli/cmd_model.cpp) on a model file: logits of the last
    t_out positions of `tokens` (None: all), and with `targets` the loss and every gradient.
    Returns the result file's tensors (dict of torch tensors). Raises orthros.Error with the
    command's message when it fails."""
    from safetensors.torch import load
    cmd = [str(orthros_exe), "model", "--weights", str(weights), "--tokens", ",".join(str(int(t)) for t in tokens),
           "--dtype", dtype, "--out", str(out)]
    if t_out is not None:
        cmd += ["--t-out", str(int(t_out))]
    if targets is not None:
        cmd += ["--targets", ",".join(str(int(t)) for t in targets)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise Error(f"{' '.join(cmd[:2])} failed ({r.returncode}): {r.stderr.strip()}")
    with open(out, "rb") as f:  # read into memory: a later run may rewrite `out` (a mapped file would fault)
        return load(f.read())
