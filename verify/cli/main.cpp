// The `orthros` command: the main job (`orthros verify`) and the tools ports use.
// Subcommands live in cmd_*.cpp and register through command.hpp.
#include "command.hpp"

#include "orthros/tensor.hpp"

#include <cstdio>
#include <exception>
#include <map>
#include <memory>

namespace orthros::cli {
namespace {
struct Entry {
  std::string description;
  Setup setup;
};
std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}
}  // namespace

bool add_command(const std::string& name, const std::string& description, Setup setup) {
  registry()[name] = Entry{description, std::move(setup)};
  return true;
}
}  // namespace orthros::cli

int main(int argc, char** argv) {
  using namespace orthros::cli;
  CLI::App app{"orthros: reference oracle and verification suite for Orthros attention (arXiv 2610.13735)"};
  app.require_subcommand(1);
#ifndef ORTHROS_VERSION
#define ORTHROS_VERSION "unknown"
#endif
#ifdef ORTHROS_HAVE_CUDA
  app.set_version_flag("--version", "orthros " ORTHROS_VERSION " (CPU oracle and CUDA kernels)");
#else
  app.set_version_flag("--version", "orthros " ORTHROS_VERSION " (CPU oracle; built without CUDA)");
#endif
  std::map<std::string, std::function<int()>> actions;
  for (auto& [name, entry] : registry()) {
    CLI::App* sub = app.add_subcommand(name, entry.description);
    actions[name] = entry.setup(*sub);
  }
  // Usage mistakes get the same one-line form and exit status as bad input files.
  if (argc > 1 && argv[1][0] != '-' && !registry().count(argv[1])) {
    std::string known;
    for (auto& [name, entry] : registry()) known += (known.empty() ? "" : ", ") + name;
    std::fprintf(stderr, "orthros: error: unknown command '%s' (known: %s)\n", argv[1], known.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "orthros: error: %s (see --help)\n", e.what());
    return 2;
  }
  try {
    for (auto& [name, action] : actions)
      if (app.got_subcommand(name)) return action();
  } catch (const orthros::Error& e) {
    std::fprintf(stderr, "orthros: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "orthros: error: %s\n", e.what());
    return 3;
  }
  return 1;
}
