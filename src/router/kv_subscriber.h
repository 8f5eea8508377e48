// `pagoda router --kv-events`: one thread subscribes (ZeroMQ SUB) to every
// replica's KV event stream (kv_wire.h), keeps the messages in order by their
// sequence numbers and applies them to a KvIndex.
//  - A gap (a sequence number past the next expected one) is recovered through
//    the replica's replay socket (DEALER to its ROUTER: [b"", start_seq] ->
//    [b"", seq, payload]... then [b"", -1, b""]); when the replay buffer no longer
//    holds the missing messages the replica's entries are dropped and the stream
//    is taken up from there ("lost" gap).
//  - A sequence number at or below the last one seen on the SUB socket (the
//    replica restarted and counts from 0 again) or an AllBlocksCleared drops the
//    replica's entries before the new events are applied.
//  - drop() (the router's health check failed) drops a replica's entries at once;
//    resync() (it answers again) rebuilds them from its replay buffer.
// A replica that publishes nothing is not dropped for that alone: an idle engine
// has nothing to publish; its health check decides.
// The replay wait is bounded (replay_timeout_s); other replicas' messages queue
// in their SUB sockets meanwhile.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "router/kv_index.h"

namespace pagoda::router {

struct KvEventEndpoints {
  std::string events;  // tcp://host:5557 (connected)
  std::string replay;  // tcp://host:5558 ("": gaps are not recovered, they drop the replica's entries)
};

class KvSubscriber {
 public:
  KvSubscriber(std::vector<KvEventEndpoints> endpoints, double replay_timeout_s);
  ~KvSubscriber();  // stops the thread
  Status start();   // connects the sockets (an unreachable replica is retried by ZeroMQ) and starts the thread

  void drop(int replica);    // thread-safe: entries gone now; the next message resynchronizes
  void resync(int replica);  // thread-safe: drop, then rebuild from the replay buffer (on the thread)

  int block_size() const;  // 0 until learned
  // Per replica, the prompt's leading blocks it holds; empty before the block size is known.
  // `chain`, when given, receives the prompt's router_chain (choose_kv's tie order).
  std::vector<PrefixMatch> match(const std::vector<int32_t>& prompt, std::vector<uint64_t>* chain = nullptr) const;
  size_t entries(int replica, KvMedium m) const;
  // Prometheus text (HELP/TYPE and samples) for the router's /metrics;
  // replica_labels[r] is the label set of replica r (replica="...").
  std::string render_metrics(const std::vector<std::string>& replica_labels) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagoda::router
