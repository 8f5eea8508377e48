// The planner-input flags that `pagoda size` and `pagoda sim` both take.
#pragma once
#include <string>

#include "sim/planner.h"

namespace pagoda::cli {

class Args;  // cli/engine_flags.h

// --kv-cache-memory BYTES (> 0), --kv-dtype/--kv-cache-dtype T (K and V, or "K/V"),
// -ctk/--cache-type-k T, -ctv/--cache-type-v T and --weights-dtype T (which
// overrides the dtype read from a GGUF) into *in. Returns "" or an error; a flag
// not given leaves its field as it is.
std::string parse_plan_dtype_flags(Args& args, sim::PlanInput* in);

}  // namespace pagoda::cli
