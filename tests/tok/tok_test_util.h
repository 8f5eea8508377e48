// Shared loading helpers for the tok/ tests: each model is opened once per process.
#pragma once
#include <string>
#include <vector>

#include "tok/tokenizer.h"

namespace pagoda::tok::testing {

std::string stories_path();
std::string smollm2_path();
// nullptr (with a message in *why) when the file is missing or fails to load.
const Tokenizer* stories(std::string* why);
const Tokenizer* smollm2(std::string* why);
std::string read_file(const std::string& path);

}  // namespace pagoda::tok::testing
