// Built instead of model_gguf.cc while the gguf/ library has no sources yet.
#include "sim/model_desc.h"

namespace pagoda::sim {

Expected<ModelDesc> load_gguf_model(const std::string& path) {
  return errorf("%s: this build has no GGUF reader (src/gguf has no library yet)", path.c_str());
}

}  // namespace pagoda::sim
