/// \file command.hpp
/// \brief Registry of `orthros` subcommands. Each `cmd_*.cpp` in reference/cli/ registers
/// itself at static-initialization time, so adding a subcommand touches no other file.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace orthros::cli {

/// A subcommand: `setup` adds its options to `sub` and returns the action to run after parsing.
/// The action returns the process exit status.
using Setup = std::function<std::function<int()>(CLI::App& sub)>;

/// Registers a subcommand `name` with a one-line description. Returns true (for static init).
bool add_command(const std::string& name, const std::string& description, Setup setup);

}  // namespace orthros::cli
