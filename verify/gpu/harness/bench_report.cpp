// JSON rows and error handling of the GPU benchmark programs (bench_report.hpp).
#include "bench_report.hpp"

#include <cstdio>
#include <exception>
#include <fstream>
#include <stdexcept>

namespace orthros::gpu_harness {

void write_bench_json(const std::string& path, nlohmann::json header, const std::vector<BenchRow>& rows,
                      bool with_bytes) {
  nlohmann::json out = std::move(header);
  out["rows"] = nlohmann::json::array();
  for (const BenchRow& r : rows) {
    nlohmann::json j = {{"name", r.name}, {"shape", r.shape}, {"median_ms", r.ms}};
    if (with_bytes) j["bytes"] = r.bytes;
    j["flops"] = r.flops;
    out["rows"].push_back(std::move(j));
  }
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write the benchmark JSON '" + path + "'");
  f << out.dump(1) << "\n";
}

int run_reporting_errors(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace orthros::gpu_harness
