"""Generation with a converted model (SPEC §4): chunked prefill with one output query at the last
prompt token, then pair decode (one base token + its output token per step) over the
never-evicted KV cache; greedy or sampled."""
from dataclasses import dataclass
from typing import List, Optional

import torch

from .. import _core

Error = _core.Error


@dataclass
class GenerationOutput:
    """tokens: per sequence, the generated token ids (list of ints, max_new_tokens each);
    logits: None, or per sequence [max_new_tokens, V] (float32) — the logits each token was chosen
    from: row 0 from the prefill's output query at the last prompt token, row s from decode step s."""
    tokens: List[List[int]]
    logits: Optional[List[torch.Tensor]] = None


def _prompts(prompts):
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() == 1:
            prompts = prompts[None]
        if prompts.dim() != 2:
            raise Error(f"prompts must be [B, T] or a list of 1-d token sequences; got shape {list(prompts.shape)}")
        return [[int(t) for t in row] for row in prompts.tolist()]
    out = []
    for i, p in enumerate(prompts):
        seq = p.tolist() if isinstance(p, torch.Tensor) else list(p)
        if not seq:
            raise Error(f"prompt {i} is empty (prefill needs at least one token)")
        out.append([int(t) for t in seq])
    if not out:
        raise Error("prompts is empty")
    return out


def _choose(logits, do_sample, temperature, top_k, top_p, generator):
    """Next token of each row of logits [B, V] (float32): argmax, or a draw from
    softmax(logits / temperature) restricted to the top_k tokens and to the smallest set whose
    probability reaches top_p."""
    if not do_sample:
        return logits.argmax(dim=-1)
    z = logits / temperature
    if top_k is not None:
        kth = torch.topk(z, min(top_k, z.shape[-1]), dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p is not None:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        cum = torch.softmax(sorted_z, dim=-1).cumsum(dim=-1)
        drop = cum - torch.softmax(sorted_z, dim=-1) >= top_p        # tokens after the set reached top_p
        z = z.scatter(-1, order, sorted_z.masked_fill(drop, float("-inf")))
    probs = torch.softmax(z, dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(logits.device)


@torch.no_grad()
def generate(model, prompts, max_new_tokens, *, do_sample=False, temperature=1.0, top_k=None, top_p=None,
             generator=None, prefill_chunk_size=None, return_logits=False):
    """Generates max_new_tokens tokens after each prompt with an OrthrosForCausalLM (SPEC §4):
    the prompt is prefilled in chunks of prefill_chunk_size tokens (None: one chunk) — every chunk
    but the last has no output token and only fills the KV cache; the last has one output query at
    the last prompt token, whose logits choose the first new token — then each step decodes a
    pair (the chosen token as a base token appended to the cache, and its output token attending
    to the whole cache). The caches are never evicted (capacity = longest prompt + max_new_tokens).

    prompts: int64 [B, T] or a list of B token sequences of any lengths (a ragged batch, decoded
    together). Greedy (argmax) unless do_sample; sampling draws from softmax(logits / temperature)
    restricted to top_k / top_p, with `generator` (a torch.Generator on the CPU) for reproducibility.
    Returns GenerationOutput (tokens, and with return_logits the logits of every choice).
    Raises orthros.Error on bad arguments."""
    seqs = _prompts(prompts)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise Error(f"max_new_tokens must be an int >= 1; got {max_new_tokens!r}")
    if do_sample and not (isinstance(temperature, (int, float)) and temperature > 0):
        raise Error(f"temperature must be > 0 when sampling; got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise Error(f"top_k must be None or an int >= 1; got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise Error(f"top_p must be None or in (0, 1]; got {top_p!r}")
    longest = max(len(s) for s in seqs)
    chunk = longest if prefill_chunk_size is None else prefill_chunk_size
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise Error(f"prefill_chunk_size must be None or an int >= 1; got {prefill_chunk_size!r}")
    device = model.hf.model.embed_tokens.weight.device
    B = len(seqs)
    caches = model.new_cache(B, longest + max_new_tokens)

    # Chunked prefill: call k holds tokens [k*chunk, (k+1)*chunk) of every prompt still running;
    # a prompt's last chunk carries its one output token.
    next_logits = [None] * B
    for start in range(0, longest, chunk):
        parts = [s[start:start + chunk] for s in seqs]
        out_lens = [1 if p and start + len(p) == len(s) else 0 for p, s in zip(parts, seqs)]
        tokens = torch.tensor([t for p in parts for t in p], dtype=torch.long, device=device)
        cu = torch.tensor([0] + [len(p) for p in parts], dtype=torch.int32).cumsum(0).to(torch.int32)
        logits = model.forward_packed(tokens, cu, out_lens, caches)
        row = 0
        for b, o in enumerate(out_lens):
            if o:
                next_logits[b] = logits[row].float()
                row += 1
    cur = torch.stack(next_logits)                                      # [B, V]
    out_tokens = [[] for _ in range(B)]
    out_logits = [[] for _ in range(B)] if return_logits else None
    cu_pairs = torch.arange(B + 1, dtype=torch.int32)
    for step in range(max_new_tokens):
        chosen = _choose(cur, do_sample, float(temperature), top_k, top_p, generator)
        for b in range(B):
            out_tokens[b].append(int(chosen[b]))
            if return_logits:
                out_logits[b].append(cur[b].cpu())
        if step + 1 == max_new_tokens:
            break
        cur = model.forward_packed(chosen.to(device=device, dtype=torch.long), cu_pairs, [1] * B, caches).float()
    return GenerationOutput(tokens=out_tokens,
                            logits=[torch.stack(r) for r in out_logits] if return_logits else None)
