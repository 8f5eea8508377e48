// Subcommand registry: each cmd_*.cc registers one `pagoda NAME` subcommand.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace pagoda::cli {

using CommandFn = std::function<int(int argc, char** argv)>;  // argv[0] is the subcommand name

struct Command {
  std::string name;
  std::string summary;
  CommandFn fn;
};

std::vector<Command>& registry();

struct Register {
  Register(std::string name, std::string summary, CommandFn fn) {
    registry().push_back({std::move(name), std::move(summary), std::move(fn)});
  }
};

// Where the default model lives: $PAGODA_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf
// next to the binary's source tree or the current directory.
std::string default_model_path();

}  // namespace pagoda::cli
