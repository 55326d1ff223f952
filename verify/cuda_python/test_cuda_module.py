"""Argument checking of orthros._cuda (cuda/python/) without a GPU: every function rejects bad
input with an orthros.Error naming the argument, before any CUDA call, and nothing crashes.

For each function a table gives one valid argument set of CPU arrays (NumPy, and torch CPU tensors
where torch is importable). The valid set must fail only because the arrays are not CUDA arrays;
each array argument is then broken one way at a time (wrong dtype, a wrong axis length,
non-contiguous, misaligned) and the error must name that argument. Run with
PYTHONPATH=<build>/python (a CUDA build: the module exists only there).
"""
import os
import unittest

import numpy as np

import orthros
import orthros._cuda as C

SEED = int(os.environ.get("ORTHROS_TEST_SEED", "20261202"))

try:
    import torch
except ImportError:  # the torch half of the tests is skipped
    torch = None

# A ragged batch of two sequences: chunked prefill (P = 4, T = 5, T_out = 2) and PT (T = T_out = 3).
H_Q, H_KV, D, CAP = 4, 2, 16, 16
Q_LENS, OUT_LENS, CACHE_LENS = [5, 3], [2, 3], [9, 3]
TQ, TO, B = sum(Q_LENS), sum(OUT_LENS), len(Q_LENS)
# The training layout of the backward (P = 0).
BW_LENS = dict(q_lens=[5, 3], out_lens=[2, 3], cache_lens=[5, 3])
D_MODEL = 24

ACT, F32, ANY = "act", "f32", "any"  # array roles: activation dtype, float32 (LSE), any (workspace)


def attention_forward_spec():
    return dict(arrays=dict(q=(ACT, [TQ, H_Q, D]), q_out=(ACT, [TO, H_Q, D]), k_cache=(ACT, [B, CAP, H_KV, D]),
                            v_cache=(ACT, [B, CAP, H_KV, D]), o=(ACT, [TQ, H_Q, D]), o_out=(ACT, [TO, H_Q, D]),
                            lse=(F32, [TQ, H_Q]), lse_out=(F32, [TO, H_Q]), workspace=(ANY, [64])),
                scalars=dict(q_lens=Q_LENS, out_lens=OUT_LENS, cache_lens=CACHE_LENS, window=4), align=16,
                dtype_from="q")


def attention_backward_spec():
    T, TOB = sum(BW_LENS["q_lens"]), sum(BW_LENS["out_lens"])
    a = dict(q=(ACT, [T, H_Q, D]), q_out=(ACT, [TOB, H_Q, D]), k_cache=(ACT, [B, CAP, H_KV, D]),
             v_cache=(ACT, [B, CAP, H_KV, D]), o=(ACT, [T, H_Q, D]), o_out=(ACT, [TOB, H_Q, D]),
             lse=(F32, [T, H_Q]), lse_out=(F32, [TOB, H_Q]), d_o=(ACT, [T, H_Q, D]), d_o_out=(ACT, [TOB, H_Q, D]),
             dq=(ACT, [T, H_Q, D]), dq_out=(ACT, [TOB, H_Q, D]), dk=(ACT, [T, H_KV, D]), dv=(ACT, [T, H_KV, D]),
             workspace=(ANY, [64]))
    return dict(arrays=a, scalars=dict(BW_LENS, window=4), align=16, dtype_from="q")


def rope_append_kv_spec():
    return dict(arrays=dict(k_new=(ACT, [TQ, H_KV, D]), v_new=(ACT, [TQ, H_KV, D]), k_cache=(ACT, [B, CAP, H_KV, D]),
                            v_cache=(ACT, [B, CAP, H_KV, D]), q=(ACT, [TQ, H_Q, D]), q_out=(ACT, [TO, H_Q, D])),
                scalars=dict(q_lens=Q_LENS, out_lens=OUT_LENS, cache_lens=CACHE_LENS, theta=1e4, num_q_heads=H_Q),
                align=16, dtype_from="k_cache")


def layer_config(dtype):
    return dict(dtype=dtype, d_model=D_MODEL, num_q_heads=H_Q, num_kv_heads=H_KV, head_dim=D, window=4,
                rope_theta=1e4, qk_norm=True, rms_eps=1e-6)


def layer_weights(prefix=""):
    d, dkv = H_Q * D, H_KV * D
    return {prefix + "w_q": (ACT, [D_MODEL, d]), prefix + "w_k": (ACT, [D_MODEL, dkv]),
            prefix + "w_v": (ACT, [D_MODEL, dkv]), prefix + "w_o": (ACT, [d, D_MODEL]),
            prefix + "alpha": (ACT, [d]), prefix + "beta": (ACT, [d]), prefix + "alpha_out": (ACT, [d]),
            prefix + "beta_out": (ACT, [d]), prefix + "q_norm": (ACT, [D]), prefix + "k_norm": (ACT, [D])}


def layer_forward_spec():
    a = dict(x=(ACT, [TQ, D_MODEL]), x_out=(ACT, [TO, D_MODEL]), k_cache=(ACT, [B, CAP, H_KV, D]),
             v_cache=(ACT, [B, CAP, H_KV, D]), y=(ACT, [TQ, D_MODEL]), y_out=(ACT, [TO, D_MODEL]),
             workspace=(ANY, [512]))
    a.update(layer_weights())
    return dict(arrays=a, scalars=dict(q_lens=Q_LENS, out_lens=OUT_LENS, cache_lens=CACHE_LENS), align=256,
                layer=True)


def layer_backward_spec():
    T, TOB = sum(BW_LENS["q_lens"]), sum(BW_LENS["out_lens"])
    a = dict(x=(ACT, [T, D_MODEL]), x_out=(ACT, [TOB, D_MODEL]), dy=(ACT, [T, D_MODEL]),
             dy_out=(ACT, [TOB, D_MODEL]), dx=(ACT, [T, D_MODEL]), dx_out=(ACT, [TOB, D_MODEL]),
             workspace=(ANY, [512]))
    a.update(layer_weights())
    a.update(layer_weights("d"))  # dw_q, ..., dalpha, ..., dk_norm
    return dict(arrays=a, scalars=dict(BW_LENS), align=256, layer=True)


SPECS = dict(attention_forward=attention_forward_spec, attention_backward=attention_backward_spec,
             rope_append_kv=rope_append_kv_spec, layer_forward=layer_forward_spec,
             layer_backward=layer_backward_spec)


class NumpyArrays:
    """Builds the arrays of a spec as NumPy arrays (f16 activations: NumPy has no bf16)."""
    name = "numpy"
    act = np.float16
    act_name = "f16"
    other_act = np.float32  # a valid activation dtype that is not `act`

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def filled(self, shape, dtype):
        return self.rng.standard_normal(shape).astype(dtype)

    def make(self, role, shape, dtype=None):
        dtype = dtype or {ACT: self.act, F32: np.float32, ANY: np.uint8}[role]
        if role == ANY:  # a workspace: bytes, 256-byte aligned (the layer's requirement)
            n = int(np.prod(shape))
            buf = np.empty(n + 256, np.uint8)
            off = (-buf.ctypes.data) % 256
            view = buf[off:off + n].reshape(shape)
            view[...] = self.rng.integers(1, 255, size=shape, dtype=np.uint8)
            return view
        return self.filled(shape, dtype)

    def wrong_dtype(self, role):
        return {ACT: np.float64, F32: np.float16}[role]

    def non_contiguous(self, role, shape):
        wide = list(shape)
        wide[-1] *= 2
        return self.make(role, wide)[..., ::2]

    def misaligned(self, role, shape, align):
        """A view of `shape` whose data pointer is 4 bytes past an `align`-byte boundary."""
        dtype = np.dtype({ACT: self.act, F32: np.float32, ANY: np.uint8}[role])
        n = int(np.prod(shape))
        buf = np.empty(n * dtype.itemsize + 2 * align, np.uint8)
        off = (-buf.ctypes.data) % align + 4
        view = buf[off:off + n * dtype.itemsize].view(dtype).reshape(shape)
        view[...] = self.make(role, shape) if role != ANY else 7
        assert view.ctypes.data % align == 4
        return view


class TorchArrays(NumpyArrays):
    """The same arrays as torch CPU tensors (bf16 activations)."""
    name = "torch"

    def __init__(self, seed):
        super().__init__(seed)
        self.act = torch.bfloat16
        self.act_name = "bf16"
        self.other_act = torch.float16

    def make(self, role, shape, dtype=None):
        g = torch.Generator().manual_seed(int(self.rng.integers(1 << 31)))
        if role == ANY and dtype is None:
            n = int(np.prod(shape))
            buf = torch.empty(n + 256, dtype=torch.uint8)
            off = (-buf.data_ptr()) % 256
            return buf[off:off + n].view(tuple(shape)).copy_(
                torch.randint(1, 255, tuple(shape), dtype=torch.uint8, generator=g))
        dtype = dtype or {ACT: self.act, F32: torch.float32}[role]
        return torch.randn(tuple(shape), generator=g, dtype=torch.float32).to(dtype)

    def wrong_dtype(self, role):
        return {ACT: torch.float64, F32: torch.bfloat16}[role]

    def misaligned(self, role, shape, align):
        dtype = {ACT: self.act, F32: torch.float32, ANY: torch.uint8}[role]
        size = torch.empty((), dtype=dtype).element_size()
        n = int(np.prod(shape))
        buf = torch.empty(n * size + 2 * align, dtype=torch.uint8)
        off = (-buf.data_ptr()) % align + 4
        view = buf[off:off + n * size].view(dtype).reshape(shape)
        view.copy_(self.make(role, shape))
        assert view.data_ptr() % align == 4
        return view


class ValidationCases:
    """Mixin: the table-driven checks, over self.arrays_kind (NumpyArrays or TorchArrays)."""
    arrays_kind = NumpyArrays

    def setUp(self):
        self.gen = self.arrays_kind(SEED)

    def call(self, fn, spec, override=None, drop=()):
        kw = {k: self.gen.make(role, shape) for k, (role, shape) in spec["arrays"].items()}
        kw.update(spec["scalars"])
        if spec.get("layer"):
            kw.update(layer_config(self.gen.act_name))
        for k in drop:
            kw.pop(k)
        kw.update(override or {})
        return getattr(C, fn)(**kw)

    def expect_error(self, fn, spec, override, name, fragment, drop=()):
        with self.assertRaises(orthros.Error, msg=f"{fn}: {override.keys()} (seed {SEED})") as cm:
            self.call(fn, spec, override, drop)
        msg = str(cm.exception)
        self.assertTrue(msg.startswith(name + " ") or msg.startswith(name + ":"),
                        f"{fn}: the error does not start with the argument {name}: {msg!r}")
        self.assertIn(fragment, msg, f"{fn}: {name}: {msg!r}")

    def first_array(self, spec):
        return next(iter(spec["arrays"]))

    def test_valid_cpu_arguments_fail_only_on_the_device(self):
        for fn, make_spec in SPECS.items():
            spec = make_spec()
            first = {"layer_forward": "x", "layer_backward": "x"}.get(fn, self.first_array(spec))
            self.expect_error(fn, spec, {}, first, "must be a CUDA array (got a CPU array)")

    def test_wrong_dtype_names_the_argument(self):
        for fn, make_spec in SPECS.items():
            spec = make_spec()
            for name, (role, shape) in spec["arrays"].items():
                if role == ANY:
                    continue
                bad = self.gen.make(role, shape, self.gen.wrong_dtype(role))
                self.expect_error(fn, spec, {name: bad}, name, "dtype")
                # A valid dtype, but not the call's (the array that defines the call's dtype is
                # then consistent and the next one is named instead).
                if role == ACT and name != spec.get("dtype_from"):
                    other = self.gen.make(role, shape, self.gen.other_act)
                    self.expect_error(fn, spec, {name: other}, name, "dtype")

    def test_wrong_shape_names_the_argument(self):
        for fn, make_spec in SPECS.items():
            spec = make_spec()
            for name, (role, shape) in spec["arrays"].items():
                if role == ANY:
                    continue
                longer = list(shape)
                longer[0] += 1
                self.expect_error(fn, spec, {name: self.gen.make(role, longer)}, name, "has shape")
                self.expect_error(fn, spec, {name: self.gen.make(role, list(shape) + [1])}, name, "has shape")

    def test_non_contiguous_names_the_argument(self):
        for fn, make_spec in SPECS.items():
            spec = make_spec()
            for name, (role, shape) in spec["arrays"].items():
                bad = self.gen.non_contiguous(role, shape)
                self.expect_error(fn, spec, {name: bad}, name, "must be C-contiguous")

    def test_misaligned_names_the_argument(self):
        for fn, make_spec in SPECS.items():
            spec = make_spec()
            for name, (role, shape) in spec["arrays"].items():
                align = spec["align"] if name == "workspace" else 16  # the layer's workspace: 256
                bad = self.gen.misaligned(role, shape, align)
                self.expect_error(fn, spec, {name: bad}, name, f"must be {align}-byte aligned")


class NumpyValidation(ValidationCases, unittest.TestCase):
    arrays_kind = NumpyArrays


@unittest.skipIf(torch is None, "torch is not importable in this interpreter: the torch CPU tensor half is skipped")
class TorchValidation(ValidationCases, unittest.TestCase):
    arrays_kind = TorchArrays

    def test_requires_grad_tensor_is_accepted_up_to_the_device_check(self):
        spec = attention_forward_spec()
        q = self.gen.make(ACT, [TQ, H_Q, D]).requires_grad_()
        self.expect_error("attention_forward", spec, {"q": q}, "q", "must be a CUDA array")


class ModuleAndLengths(unittest.TestCase):
    def test_module(self):
        self.assertIs(C.Error, orthros.Error)
        self.assertTrue(issubclass(orthros.Error, ValueError))
        for fn in ("hopper_kernels_available", "attention_workspace_bytes", "attention_forward",
                   "attention_backward_workspace_bytes", "attention_backward", "rope_append_kv",
                   "layer_workspace_bytes", "layer_forward", "layer_backward_workspace_bytes", "layer_backward"):
            self.assertTrue(callable(getattr(C, fn)), fn)

    @unittest.skipIf(os.path.exists("/dev/nvidiactl"), "a GPU driver is present: the GPU tests check this")
    def test_hopper_kernels_available_is_false_without_a_gpu(self):
        self.assertIs(C.hopper_kernels_available(), False)
        self.assertIs(C.hopper_kernels_available(), False)  # and again: no error was left behind

    def fwd(self, **over):
        gen = NumpyArrays(SEED)
        spec = attention_forward_spec()
        kw = {k: gen.make(r, s) for k, (r, s) in spec["arrays"].items()}
        kw.update(spec["scalars"])
        kw.update(over)
        return C.attention_forward(**kw)

    def expect(self, fragment, **over):
        with self.assertRaises(orthros.Error) as cm:
            self.fwd(**over)
        self.assertIn(fragment, str(cm.exception))

    def test_lengths(self):
        self.expect("one entry per sequence", q_lens=[5, 3, 1])
        self.expect("out_lens[0] (T_out) must be <= q_lens[0] = 5 (got 6)", out_lens=[6, 3])
        self.expect("cache_lens[1] (P + T) must be >= q_lens[1] = 3 (got 2)", cache_lens=[9, 2])
        self.expect("q_lens[1] must be >= 0 (got -3)", q_lens=[5, -3])
        self.expect("q_lens[0] must be an int (got float)", q_lens=[5.0, 3])
        self.expect("q_lens must be a list of ints (got None)", q_lens=None)
        self.expect("q_lens must be a list or tuple of ints", q_lens="53")
        self.expect("cache_lens[0] = 17 exceeds the k_cache/v_cache capacity 16", cache_lens=[17, 3])
        # Host-side integer arrays are accepted (then the CPU arrays are what is wrong).
        self.expect("q must be a CUDA array", q_lens=np.array(Q_LENS, np.int32), cache_lens=np.array(CACHE_LENS))
        self.expect("q_lens must have an integer dtype", q_lens=np.array(Q_LENS, np.float32))
        self.expect("q_lens must be 1-d", q_lens=np.array([Q_LENS]))

    def test_shapes_name_the_expected_sizes(self):
        gen = NumpyArrays(SEED)
        self.expect("q has shape [9, 4, 16]; expected [sum T_b = 8, H_q, D]", q=gen.make(ACT, [9, H_Q, D]))
        self.expect("v_cache has shape [2, 16, 1, 16]; expected [B = 2, capacity = 16, H_kv = 2, D = 16]",
                    v_cache=gen.make(ACT, [B, CAP, 1, D]))
        self.expect("o_out has shape [5, 3, 16]; expected [sum T_out_b = 5, H_q = 4, D = 16]",
                    o_out=gen.make(ACT, [TO, 3, D]))

    def test_none_rules(self):
        self.expect("q_out must be an array (got None)", q_out=None)
        self.expect("q must be an array (got None)", q=None)
        # lse / lse_out / workspace may be None: the CPU arrays are then what is wrong.
        self.expect("q must be a CUDA array", lse=None, lse_out=None, workspace=None)
        # q_out / o_out may be None when no output query exists.
        self.expect("q must be a CUDA array", q_out=None, o_out=None, lse_out=None, out_lens=[0, 0])

    def test_not_an_array(self):
        self.expect("q must be an array that speaks DLPack", q=[[1.0]])
        self.expect("k_cache must be an array that speaks DLPack", k_cache="k")

    def test_dlpack_capsule(self):
        gen = NumpyArrays(SEED)
        capsule = gen.make(ACT, [TQ, H_Q, D]).__dlpack__()
        self.expect("q must be a CUDA array (got a CPU array)", q=capsule)
        self.expect("q is a DLPack capsule that was already consumed", q=capsule)

    def test_options(self):
        self.expect('kernel must be one of "automatic", "hopper", "generic" (got "fast")', kernel="fast")
        self.expect("stream must be a cudaStream_t handle value >= 0", stream=-1)
        with self.assertRaises(TypeError):  # keyword-only
            C.attention_forward(1, 2)

    def test_backward_rejects_cached_tokens(self):
        gen = NumpyArrays(SEED)
        spec = attention_backward_spec()
        kw = {k: gen.make(r, s) for k, (r, s) in spec["arrays"].items()}
        kw.update(spec["scalars"], cache_lens=[7, 3])
        with self.assertRaisesRegex(orthros.Error, r"training sequences \(P = 0\): cache_lens\[0\] must equal "
                                                   r"q_lens\[0\] = 5 \(got 7, i.e. P = 2 cached tokens\)"):
            C.attention_backward(**kw)

    def test_rope_theta_and_q_out_without_q(self):
        gen = NumpyArrays(SEED)
        spec = rope_append_kv_spec()
        kw = {k: gen.make(r, s) for k, (r, s) in spec["arrays"].items()}
        kw.update(spec["scalars"])
        with self.assertRaisesRegex(orthros.Error, "q_out is rotated together with q"):
            C.rope_append_kv(**dict(kw, q=None))
        with self.assertRaisesRegex(orthros.Error, r"q has shape \[8, 4, 16\]; expected \[sum T_b = 8, H_q = "
                                                   r"num_q_heads = 3, D = 16\]"):
            C.rope_append_kv(**dict(kw, num_q_heads=3))

    def test_workspace_sizes(self):
        common = dict(dtype="bf16", num_q_heads=H_Q, num_kv_heads=H_KV, head_dim=D, window=4)
        # 8 bytes (Δ and the log2 LSE, float32 each) per row and query head of both streams
        # (attention_backward.hpp).
        n = C.attention_backward_workspace_bytes(**common, **BW_LENS)
        self.assertEqual(n, 8 * (sum(BW_LENS["q_lens"]) + sum(BW_LENS["out_lens"])) * H_Q)
        with self.assertRaisesRegex(orthros.Error, "window must be >= 1"):
            C.attention_workspace_bytes(**dict(common, window=0), q_lens=Q_LENS, out_lens=OUT_LENS,
                                        cache_lens=CACHE_LENS)
        with self.assertRaisesRegex(orthros.Error, 'dtype must be one of "bf16", "f16", "f32" \\(got "f64"\\)'):
            C.attention_workspace_bytes(**dict(common, dtype="f64"), q_lens=Q_LENS, out_lens=OUT_LENS,
                                        cache_lens=CACHE_LENS)
        with self.assertRaisesRegex(orthros.Error, "H_q % H_kv must be 0"):
            C.attention_backward_workspace_bytes(**dict(common, num_kv_heads=3), **BW_LENS)
        # The forward's split heuristic asks the device for its SM count: an int with a GPU, a
        # RuntimeError (not a crash) without one.
        try:
            n = C.attention_workspace_bytes(**common, q_lens=Q_LENS, out_lens=OUT_LENS, cache_lens=CACHE_LENS)
            self.assertIsInstance(n, int)
        except RuntimeError as e:
            self.assertIn("cuda", str(e).lower())
        with self.assertRaisesRegex(orthros.Error, "rope_theta must be finite and > 0"):
            C.layer_workspace_bytes(**dict(layer_config("bf16"), rope_theta=-1.0), q_lens=Q_LENS,
                                    out_lens=OUT_LENS, cache_lens=CACHE_LENS)

    def test_layer_keywords(self):
        with self.assertRaisesRegex(TypeError, "layer_forward\\(\\) got an unexpected keyword argument 'w_x'"):
            C.layer_forward(**layer_config("bf16"), w_x=1)
        with self.assertRaisesRegex(TypeError, "missing required keyword argument 'q_lens'"):
            C.layer_backward_workspace_bytes(**layer_config("bf16"))
        with self.assertRaisesRegex(orthros.Error, "d_model has the wrong type"):
            C.layer_workspace_bytes(**dict(layer_config("bf16"), d_model="24"), q_lens=Q_LENS, out_lens=OUT_LENS,
                                    cache_lens=CACHE_LENS)

    def test_layer_qk_norm_off_allows_none(self):
        gen = NumpyArrays(SEED)
        spec = layer_forward_spec()
        kw = {k: gen.make(r, s) for k, (r, s) in spec["arrays"].items()}
        kw.update(spec["scalars"], **layer_config("f16"))
        with self.assertRaisesRegex(orthros.Error, r"q_norm must be an array \(got None\)"):
            C.layer_forward(**dict(kw, q_norm=None))
        with self.assertRaisesRegex(orthros.Error, "x must be a CUDA array"):
            C.layer_forward(**dict(kw, q_norm=None, k_norm=None, qk_norm=False))


if __name__ == "__main__":
    unittest.main()
