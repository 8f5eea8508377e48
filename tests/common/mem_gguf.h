// A GGUF written to memory and parsed back, the bytes kept alive beside the
// parsed file (GgufFile::from_memory does not copy): shared by the model tests
// that build or edit models without touching the disk.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"

namespace pagoda::testutil {

struct MemModel {
  std::shared_ptr<std::vector<uint8_t>> bytes;  // the serialized file; `file` points into it
  std::shared_ptr<const gguf::GgufFile> file;
};

inline Expected<MemModel> to_memory(const gguf::GgufWriter& w) {
  MemModel m;
  PAGODA_ASSIGN_OR_RETURN(std::vector<uint8_t> b, w.write_to_memory());
  m.bytes = std::make_shared<std::vector<uint8_t>>(std::move(b));
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> f,
                          gguf::GgufFile::from_memory(m.bytes->data(), m.bytes->size()));
  m.file = std::shared_ptr<const gguf::GgufFile>(std::move(f));
  return m;
}

}  // namespace pagoda::testutil
