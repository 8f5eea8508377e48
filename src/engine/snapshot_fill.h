// Engine-internal: fills a DashboardSnapshot from the scheduler and the KV
// manager (EngineImpl::snapshot calls it; kept out of engine.cc, which is the
// generation path).
#pragma once
#include <cstdint>
#include <functional>

#include "engine/snapshot.h"

namespace pagoda::kv { class KvManager; }
namespace pagoda::sched { class Scheduler; }

namespace pagoda::engine {

// The engine request id and choice index of scheduler id `seq`; false when unknown.
using ChoiceOf = std::function<bool(uint64_t seq, uint64_t* id, int* index)>;

void fill_snapshot(const sched::Scheduler& sched, const kv::KvManager& kv, const ChoiceOf& choice_of,
                   const SnapshotOptions& opt, DashboardSnapshot* out);

}  // namespace pagoda::engine
