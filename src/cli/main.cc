#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "base/log.h"
#include "base/log_control.h"
#include "cli/command.h"

namespace pagoda::cli {

std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}

std::string default_model_path() {
  if (const char* e = std::getenv("PAGODA_MODEL")) return e;
  const char* rel = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (std::filesystem::exists(rel)) return rel;
#ifdef PAGODA_SOURCE_DIR
  std::string p = std::string(PAGODA_SOURCE_DIR) + "/" + rel;
  if (std::filesystem::exists(p)) return p;
#endif
  return rel;
}

}  // namespace pagoda::cli

static void usage() {
  auto cmds = pagoda::cli::registry();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::fprintf(stderr, "usage: pagoda <command> [options]   (pagoda --version: the version)\n\ncommands:\n");
  for (auto& c : cmds) std::fprintf(stderr, "  %-10s %s\n", c.name.c_str(), c.summary.c_str());
  std::fprintf(stderr, "\nRun `pagoda <command> --help` for the options of one command.\n");
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "-V")) {
    std::printf("pagoda %s\n", pagoda::version_string());
    return 0;
  }
  for (auto& c : pagoda::cli::registry()) {
    if (c.name == argv[1]) return c.fn(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "pagoda: unknown command '%s'\n\n", argv[1]);
  usage();
  return 2;
}
