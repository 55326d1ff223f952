// `orthros attention --in CASE.safetensors --out RESULT.safetensors [--precision f64|f32]`:
// runs the oracle's attention operator (SPEC §2) on a case file in the SPEC §5 format.
// This is how ports and outside checkers use the oracle.
#include "command.hpp"

#include "orthros/attention.hpp"
#include "orthros/case_io.hpp"
#include "orthros/safetensors.hpp"

#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <cstdio>
#include <string>

namespace orthros::cli {
namespace {

/// Loads the case at precision S (inputs widened exactly for f64; rounded to nearest even
/// for f32 when they are F64), runs orthros_attention<S> and writes o, o_out, lse, lse_out
/// in `out_dtype` with provenance metadata. Returns the exit status (0).
template <typename S>
int run_attention(const std::string& in, const std::string& out, st::DType out_dtype) {
  if constexpr (!std::is_same_v<S, double>) {  // a finite input that S cannot hold is a usage error, not "inf"
    const AttentionCase<double> wide = load_attention_case<double>(in);
    const double limit = static_cast<double>(std::numeric_limits<S>::max());
    for (const auto& [name, m] : {std::pair<const char*, const Mat<double>*>{"q", &wide.q}, {"k", &wide.k},
                                  {"v", &wide.v}, {"q_out", &wide.q_out}})
      for (Eigen::Index i = 0; i < m->size(); ++i)
        require(std::abs(m->data()[i]) <= limit, in, ": --precision ", dtype_name<S>(), ": ", name, " holds ",
                m->data()[i], ", beyond ", dtype_name<S>(), "'s range (", limit, "); use --precision f64");
  }
  const AttentionCase<S> c = load_attention_case<S>(in);
  AttentionResult<S> r;
  try {
    r = orthros_attention<S>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
  } catch (const Error& e) {
    throw Error(detail::cat(in, ": ", e.what()));
  }
  st::File f = make_attention_result<S>(r, c.dims, out_dtype);
  char scale[64];
  std::snprintf(scale, sizeof scale, "%.17g", softmax_scale(c.options, c.dims.head_dim));
  f.metadata["producer"] = "orthros attention";
  f.metadata["precision"] = dtype_name<S>();
  f.metadata["window"] = std::to_string(c.options.window);
  f.metadata["scale"] = scale;
  st::write_file(out, f);
  std::printf("orthros attention: T=%lld P=%lld T_out=%lld H_q=%d H_kv=%d D=%d window=%lld scale=%s precision=%s -> %s\n",
              static_cast<long long>(c.T), static_cast<long long>(c.P), static_cast<long long>(c.T_out),
              c.dims.num_q_heads, c.dims.num_kv_heads, c.dims.head_dim, static_cast<long long>(c.options.window),
              scale, dtype_name<S>(), out.c_str());
  return 0;
}

struct Args {
  std::string in, out, precision = "f64";
};

const bool reg = add_command(
    "attention",
    "Run the attention operator on a case file (SPEC §5): q, k, v, q_out + metadata window[, scale] -> "
    "o, o_out, lse, lse_out",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<Args>();
      sub.add_option("--in", a->in, "case .safetensors: q [T,H_q,D], k/v [P+T,H_kv,D], q_out [T_out,H_q,D]; "
                                    "metadata window (int >= 1), optional scale")
          ->required();
      sub.add_option("--out", a->out, "result .safetensors: o, o_out, lse, lse_out")->required();
      sub.add_option("--precision", a->precision, "compute and write in f64 (default) or f32")
          ->check(CLI::IsMember({"f64", "f32"}));
      return [a]() -> int {
        if (a->precision == "f32") return run_attention<float>(a->in, a->out, st::DType::F32);
        return run_attention<double>(a->in, a->out, st::DType::F64);
      };
    });

}  // namespace
}  // namespace orthros::cli
