// Runs the built `pagoda` binary (PAGODA_BIN, defined by the test's CMake) and
// captures its output: shared by the CLI tests.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

namespace pagoda::testutil {

struct CliResult {
  int exit_code = -1;
  std::string out;
};

// `pagoda ARGS`, capturing stdout (stderr too with merge_stderr, else discarded).
inline CliResult run_pagoda(const std::string& args, bool merge_stderr = false) {
  const std::string cmd = std::string("'") + PAGODA_BIN + "' " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// The raw little-endian f32 file `pagoda run --logits-out[-all]` writes; empty
// when it cannot be opened.
inline std::vector<float> read_floats(const std::string& path) {
  std::vector<float> v;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return v;
  float x;
  while (std::fread(&x, sizeof x, 1, f) == 1) v.push_back(x);
  std::fclose(f);
  return v;
}

}  // namespace pagoda::testutil
