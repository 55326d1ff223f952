/// \file bench_report.hpp
/// \brief The rows the GPU benchmark programs (bench/gpu) print and write as JSON, and their
/// error handling: one format for every program.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace orthros::gpu_harness {

/// One timed case: median milliseconds per call and the case's FLOPs and bytes (CaseShape; 0 when
/// the row has no count).
struct BenchRow {
  std::string name, shape;
  double ms = 0, bytes = 0, flops = 0;
};

/// Writes `header` (device, runs, ...) plus "rows": [{"name", "shape", "median_ms", "bytes" (only
/// when with_bytes), "flops"}] to `path`. Throws std::runtime_error naming the path when it
/// cannot be written.
void write_bench_json(const std::string& path, nlohmann::json header, const std::vector<BenchRow>& rows,
                      bool with_bytes);

/// Runs `body` and returns its status; an exception is printed as "<program>: <what>" on stderr
/// and gives status 1.
int run_reporting_errors(const char* program, const std::function<int()>& body);

}  // namespace orthros::gpu_harness
