// `pagoda run --json-schema FILE` and `--grammar-regex RE` on stories260K: the
// output is in the language and generation stops when it is complete; a bad
// schema or regex is refused with its path / offset before any generation.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/reference_jsonl.h"
#include "common/run_pagoda.h"

namespace {

using pagoda::testutil::run_pagoda;

std::string write_temp(const std::string& text) {
  char path[] = "/tmp/pagoda_schema_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  if (fd >= 0) close(fd);
  std::ofstream(path) << text;
  return path;
}

TEST(RunConstrained, JsonSchemaOutputValidatesAndStops) {
  const std::string model = pagoda::testutil::stories_path();
  const std::string schema = write_temp(
      R"({"type":"object","properties":{"hero":{"enum":["Lily","Tom"]},"age":{"type":"integer","minimum":1,"maximum":9}},"required":["hero","age"]})");
  for (const char* seed : {"1", "2"}) {
    auto r = run_pagoda("run -m '" + model + "' -p 'Once upon a time' -n 60 --temp 1 --seed " + seed +
                        " -t 1 --json --json-schema " + schema);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["finish_reason"], "stop") << r.out;
    auto v = nlohmann::json::parse(j["text"].get<std::string>());
    EXPECT_TRUE(v["hero"] == "Lily" || v["hero"] == "Tom") << v;
    EXPECT_TRUE(v["age"].is_number_integer() && v["age"] >= 1 && v["age"] <= 9) << v;
  }
  std::remove(schema.c_str());
}

TEST(RunConstrained, RegexAndErrors) {
  const std::string model = pagoda::testutil::stories_path();
  auto r = run_pagoda("run -m '" + model + "' -p 'Tom said' -n 30 --temp 0 -t 1 --json --grammar-regex ' (yes|no)!'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  const std::string text = j["text"];
  EXPECT_TRUE(text == " yes!" || text == " no!") << text;
  EXPECT_EQ(j["finish_reason"], "stop");

  const std::string bad = write_temp(R"({"type":"object","properties":{"a":{"type":"integer","minimum":"x"}}})");
  r = run_pagoda("run -m '" + model + "' -p hi -t 1 --json-schema " + bad, /*merge_stderr=*/true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("#/properties/a/minimum"), std::string::npos) << r.out;
  std::remove(bad.c_str());
  r = run_pagoda("run -m '" + model + "' -p hi -t 1 --grammar-regex '(a'", true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--grammar-regex"), std::string::npos) << r.out;
  r = run_pagoda("run -m '" + model + "' -p hi -t 1 --grammar-regex a --json-schema x", true);
  EXPECT_EQ(r.exit_code, 2) << r.out;
}

}  // namespace
