"""The CUDA path of the attention op (orthros/torch/_attention.py: _attention_cuda and
_attention_backward_cuda) on a machine without a GPU: CPU tensors through the same Python code
with a stand-in for orthros._cuda that records its arguments and, where a test asks, raises the
extension's error. Checks what that code promises: DLPack capsules and host-side length lists
reach the extension; the workspace size is asked once per layout; an argument fault the
extension reports surfaces as the op's own message naming the torch argument; an extension
error with valid arguments propagates unchanged. The kernels themselves run in test_gpu.py."""
import contextlib

import pytest
import torch

import orthros
import orthros.torch as ot
from orthros.torch import _attention
from torch_cases import make_case, op_args


class StandIn:
    """Records each call's keywords; raises `error` from the compute calls when set."""

    def __init__(self, error=None):
        self.error, self.calls = error, []

    def _record(self, name, kw):
        self.calls.append((name, kw))

    def attention_workspace_bytes(self, **kw):
        self._record("attention_workspace_bytes", kw)
        return 4096

    attention_backward_workspace_bytes = attention_workspace_bytes

    def attention_forward(self, **kw):
        self._record("attention_forward", kw)
        if self.error:
            raise self.error

    def attention_backward(self, **kw):
        """Writes seeded random packed dk [sum T_b, H_kv, D] as the kernel would (kept in self.dk)."""
        self._record("attention_backward", kw)
        if self.error:
            raise self.error
        self.dk = torch.utils.dlpack.from_dlpack(kw["dk"])
        self.dk.copy_(torch.randn(self.dk.shape, generator=torch.Generator().manual_seed(5)))


@pytest.fixture
def stand_in(monkeypatch):
    def install(error=None):
        ext = StandIn(error)
        monkeypatch.setattr(_attention, "cuda_module", lambda: ext)
        monkeypatch.setattr(_attention, "device_guard", lambda device: contextlib.nullcontext())
        monkeypatch.setattr(_attention, "stream_of", lambda device: 1234)
        monkeypatch.setattr(_attention, "_forward_sizes", _attention.SizeCache())
        monkeypatch.setattr(_attention, "_backward_sizes", _attention.SizeCache())
        return ext
    return install


def forward(c, **changes):
    a = dict(zip(("q", "q_out", "k_cache", "v_cache", "cu_seqlens_q", "cu_seqlens_out", "cache_seqlens", "window"),
                 op_args(c)))
    a.update(changes)
    return _attention._attention_cuda(*a.values(), None, False)


def test_the_extension_gets_capsules_and_length_lists(stand_in):
    ext = stand_in()
    c = make_case("ragged", 11, torch.float32)
    forward(c)
    forward(c)
    names = [n for n, _ in ext.calls]
    assert names == ["attention_workspace_bytes", "attention_forward", "attention_forward"], names
    kw = ext.calls[1][1]
    for n in ("q", "q_out", "k_cache", "v_cache", "o", "o_out", "lse", "lse_out", "workspace"):
        assert type(kw[n]).__name__ == "PyCapsule", (n, type(kw[n]))
    seqs = c["seqs"]
    assert kw["q_lens"] == [T for T, _, _ in seqs] and kw["out_lens"] == [To for _, To, _ in seqs]
    assert kw["cache_lens"] == [T + P for T, _, P in seqs]
    assert kw["stream"] == 1234 and kw["window"] == c["window"]
    # the capsule of q is q's memory (no copy)
    assert torch.utils.dlpack.from_dlpack(kw["q"]).data_ptr() == c["q"].data_ptr()


def test_no_output_queries_pass_none(stand_in):
    ext = stand_in()
    c = make_case("chunked_prefill", 12, torch.float32)
    forward(c)
    kw = ext.calls[1][1]
    assert kw["q_out"] is None and kw["o_out"] is None and kw["lse_out"] is None


@pytest.mark.parametrize("change, match", [
    (lambda c: dict(k_cache=c["k_cache"].double()), r"k_cache has dtype float64 but q has float32"),
    (lambda c: dict(q=c["q"][:, :3]), r"q must be contiguous \(shape \[39, 3, 16\]"),
    (lambda c: dict(cu_seqlens_q=torch.tensor([0, 13, 14, 22, 40], dtype=torch.int32)),
     r"cu_seqlens_q\[-1\] = 40 must equal the rows of q \(39\)"),
    (lambda c: dict(cache_seqlens=torch.tensor([13, 31, 13, 50], dtype=torch.int32)),
     r"cache_seqlens\[3\] = 50 exceeds the cache capacity 34"),
])
def test_a_fault_the_extension_reports_gets_the_op_message(stand_in, change, match):
    stand_in(orthros.Error("the extension's message"))
    c = make_case("ragged", 13, torch.float32)
    with pytest.raises(orthros.Error, match=match):
        forward(c, **change(c))


def test_a_fault_python_sees_first_keeps_its_message(stand_in):
    ext = stand_in()
    c = make_case("ragged", 14, torch.float32)
    with pytest.raises(orthros.Error, match=r"cu_seqlens_q\[0\] must be 0"):
        forward(c, cu_seqlens_q=torch.tensor([1, 13, 14, 22, 39], dtype=torch.int32))
    assert not ext.calls


def test_an_extension_error_on_valid_arguments_propagates(stand_in):
    stand_in(RuntimeError("cudaLaunchKernel: too many resources requested"))
    c = make_case("ragged", 15, torch.float32)
    with pytest.raises(RuntimeError, match="too many resources"):
        forward(c)


def backward(c):
    q, q_out = c["q"], c["q_out"]
    return _attention._attention_backward_cuda(
        q, q_out, c["k_cache"], c["v_cache"], torch.empty_like(q), torch.empty_like(q_out), torch.empty(q.shape[:2]),
        torch.empty(q_out.shape[:2]), q.clone(), q_out.clone(), c["cu_seqlens_q"], c["cu_seqlens_out"],
        c["cache_seqlens"], c["window"], None, False)


@pytest.mark.parametrize("regime", ["ragged_training", "pt"])
def test_backward_capsules_and_the_packed_gradient_layout(stand_in, regime):
    ext = stand_in()
    c = make_case(regime, 16, torch.float32, capacity_extra=0)
    k = c["k_cache"]
    dq, dq_out, dk, dv = backward(c)
    kw = ext.calls[-1][1]
    for n in ("q", "q_out", "k_cache", "v_cache", "o", "o_out", "lse", "lse_out", "d_o", "d_o_out", "dq", "dq_out",
              "dv", "workspace"):
        assert type(kw[n]).__name__ == "PyCapsule", (n, type(kw[n]))
    packed = ext.dk  # what the extension wrote
    seqs = c["seqs"]
    assert packed.shape == (sum(T for T, _, _ in seqs), k.shape[2], k.shape[3])
    assert dk.shape == k.shape and dv.shape == c["v_cache"].shape
    # sequence b's rows at cache rows 0..T_b-1, zeros after (none when every T_b is the capacity)
    cap, b0 = k.shape[1], 0
    for b, (T, _, _) in enumerate(seqs):
        assert torch.equal(dk[b, :T], packed[b0:b0 + T]) and not dk[b, T:cap].any()
        b0 += T


def test_backward_with_a_cached_prefix_raises_the_op_message(stand_in):
    ext = stand_in()
    c = make_case("ragged", 17, torch.float32)
    q, q_out = c["q"], c["q_out"]
    with pytest.raises(orthros.Error, match=r"the attention backward needs an empty KV-cache prefix"):
        _attention._attention_backward_cuda(q, q_out, c["k_cache"], c["v_cache"], q, q_out, torch.empty(q.shape[:2]),
                                            torch.empty(q_out.shape[:2]), q, q_out, c["cu_seqlens_q"],
                                            c["cu_seqlens_out"], c["cache_seqlens"], c["window"], None, False)
    assert not ext.calls
