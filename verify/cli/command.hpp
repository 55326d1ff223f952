/// \file command.hpp
/// \brief Registry of `orthros` subcommands. Each `cmd_*.cpp` in verify/cli/ registers
/// itself at static-initialization time, so adding a subcommand touches no other file.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <string>

namespace orthros::cli {

/// A subcommand: `setup` adds its options to `sub` and returns the action to run after parsing.
/// The action returns the process exit status.
using Setup = std::function<std::function<int()>(CLI::App& sub)>;

/// Registers a subcommand `name` with a one-line description. Returns true (for static init).
bool add_command(const std::string& name, const std::string& description, Setup setup);

/// Validator of an unsigned integer option such as `--seed`: digits only, value in [0, max].
/// Without it CLI11 reads "-1" into an unsigned option as 2^64-1 (strtoull wraps negatives).
inline CLI::Validator unsigned_up_to(unsigned long long max) {
  return CLI::Validator(
      [max](std::string& s) -> std::string {
        const std::string range = "must be a decimal integer in [0, " + std::to_string(max) + "] (got \"" + s + "\")";
        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return range;
        if (s.size() > 20) return range;
        errno = 0;
        const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
        if (errno == ERANGE || v > max) return range;
        return "";
      },
      "UINT");
}

}  // namespace orthros::cli
