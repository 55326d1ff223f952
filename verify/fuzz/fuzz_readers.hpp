/// \file fuzz_readers.hpp
/// \brief The fuzzed entry points (the hardened file readers): every input ends in a result or
/// an orthros::Error. Any other exception escapes to the fuzzer (reported as a crash), and so do
/// sanitizer reports. Shared by the libFuzzer targets (clang) and the corpus replay test (any
/// compiler), so the committed corpus is a regression test of every build.
#pragma once

#include "orthros/attention.hpp"
#include "orthros/case_io.hpp"
#include "orthros/portkit.hpp"
#include "orthros/safetensors.hpp"

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace orthros::fuzz {

/// Aborts (a fuzzer-visible crash) when a documented property does not hold.
inline void expect(bool ok) {
  if (!ok) std::abort();
}

/// safetensors reader: parse; a file that parses serializes to bytes that parse to the same file.
inline void safetensors_one(const std::uint8_t* data, std::size_t size) {
  st::File f;
  try {
    f = st::parse(std::vector<std::uint8_t>(data, data + size));
  } catch (const Error&) {
    return;
  }
  const st::File g = st::parse(st::serialize(f));
  expect(g.metadata == f.metadata && g.tensors.size() == f.tensors.size());
  for (const auto& [name, t] : f.tensors) {
    const auto it = g.tensors.find(name);
    expect(it != g.tensors.end() && it->second.dtype == t.dtype && it->second.shape == t.shape &&
           it->second.data == t.data);
  }
}

/// Case loader + the oracle on the case (forward): a case that loads has a finite answer or
/// the oracle says why not (orthros::Error).
inline void case_one(const std::uint8_t* data, std::size_t size) {
  try {
    const st::File f = st::parse(std::vector<std::uint8_t>(data, data + size));
    const AttentionCase<double> c = load_attention_case<double>(f);
    const AttentionResult<double> r = orthros_attention<double>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
    expect(r.o.rows() == c.T && r.o_out.rows() == c.T_out);
  } catch (const Error&) {
  }
}

/// Result and expected-file loaders.
inline void result_one(const std::uint8_t* data, std::size_t size) {
  st::File f;
  try {
    f = st::parse(std::vector<std::uint8_t>(data, data + size));
  } catch (const Error&) {
    return;
  }
  try {
    const AttentionResult<double> r = load_attention_result(f);
    expect(r.o.rows() == r.lse.rows() && r.o_out.rows() == r.lse_out.rows());
  } catch (const Error&) {
  }
  try {
    portkit::load_expected(f);
  } catch (const Error&) {
  }
}

}  // namespace orthros::fuzz
