#include "loadgen/driver.h"

namespace pagoda::loadgen {

Expected<Stream> run_one(engine::Engine& eng, const engine::RequestParams& params, const OnStep& on_step) {
  Driver d(eng);
  PAGODA_ASSIGN_OR_RETURN(engine::RequestId id, d.submit(params));
  Stream out;
  bool done = false;
  while (d.has_unfinished()) {
    const Step& st = d.step();
    for (const Stream& s : st.finished) {
      if (s.id != id) continue;
      out = s;
      done = true;
    }
    if (on_step) PAGODA_TRY(on_step(st));
  }
  if (!done) return errorf("request %llu: the engine went idle before it finished", static_cast<unsigned long long>(id));
  if (out.finish == engine::FinishReason::kError) return errorf("%s", out.error.c_str());
  return out;
}

}  // namespace pagoda::loadgen
