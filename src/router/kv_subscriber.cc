#include "router/kv_subscriber.h"

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <chrono>
#include <cstdio>
#include <optional>

#include "base/log.h"

namespace pagoda::router {
namespace {

using Clock = std::chrono::steady_clock;
// No engine step stores anywhere near this much (a 64 MiB frame is millions of token ids).
constexpr int64_t kMaxMessageBytes = int64_t{64} << 20;

struct Counters {
  std::atomic<uint64_t> messages{0}, events{0}, gaps_recovered{0}, gaps_lost{0}, replay_failures{0};
  std::atomic<uint64_t> drop_unhealthy{0}, drop_restart{0}, drop_cleared{0};
  std::atomic<uint64_t> malformed{0}, refused{0}, orphans{0};
};

// What the subscriber thread alone knows of one replica's stream.
struct StreamState {
  std::optional<uint64_t> last_sub;  // the last sequence number seen on the SUB socket
  uint64_t expected = 0;             // the next sequence number to apply
  std::unique_ptr<zmq::socket_t> dealer;
  int logged = 0;                    // warnings logged (rate limit)
};

enum Pending : int { kNone = 0, kReset = 1, kResync = 2 };

}  // namespace

struct KvSubscriber::Impl {
  std::vector<KvEventEndpoints> eps;
  double replay_timeout_s;
  zmq::context_t ctx{1};
  std::vector<zmq::socket_t> subs;
  std::vector<StreamState> streams;            // subscriber thread only
  std::vector<Counters> counters;
  std::vector<std::atomic<int>> pending;       // Pending, set by drop()/resync()
  mutable std::mutex mu;                       // guards index
  KvIndex index;
  std::atomic<bool> stop{false};
  std::thread thread;

  Impl(std::vector<KvEventEndpoints> e, double timeout)
      : eps(std::move(e)), replay_timeout_s(timeout), streams(eps.size()), counters(eps.size()),
        pending(eps.size()), index(static_cast<int>(eps.size())) {}

  void warn(size_t r, const std::string& what) {
    // The first few, then one in a thousand: a broken publisher must not flood the log.
    const int n = streams[r].logged++;
    if (n < 5 || n % 1000 == 0)
      PAGODA_LOG_WARN("router: kv events of %s: %s", eps[r].events.c_str(), what.c_str());
  }

  void clear(size_t r) {
    std::lock_guard<std::mutex> l(mu);
    index.clear(static_cast<int>(r));
  }

  void apply(size_t r, const zmq::message_t& payload) {
    auto batch = decode_kv_batch(payload.data(), payload.size());
    if (!batch.ok()) {
      ++counters[r].malformed;
      warn(r, "an undecodable message (" + batch.message() + ")");
      return;
    }
    std::lock_guard<std::mutex> l(mu);
    for (const KvEvent& ev : batch->events) {
      ++counters[r].events;
      const KvIndex::Applied a = index.apply(static_cast<int>(r), ev);
      if (ev.kind == KvEventKind::kCleared) ++counters[r].drop_cleared;
      counters[r].orphans += a.orphans;
      if (!a.refused.empty()) {
        ++counters[r].refused;
        warn(r, "BlockStored refused: " + a.refused);
      }
    }
  }

  // A message met in sequence order (from a replay, or the SUB socket after its checks).
  void ordered(size_t r, uint64_t seq, const zmq::message_t& payload) {
    StreamState& s = streams[r];
    if (seq < s.expected) return;  // applied already
    if (seq > s.expected) {        // the replay buffer no longer holds what is missing
      ++counters[r].gaps_lost;
      warn(r, "messages " + std::to_string(s.expected) + ".." + std::to_string(seq - 1) +
                  " are lost: the replica's entries are dropped and rebuilt from its next events");
      clear(r);
    }
    apply(r, payload);
    s.expected = seq + 1;
  }

  // Asks the replay socket for everything from s.expected on. False on no answer.
  bool replay(size_t r) {
    StreamState& s = streams[r];
    if (eps[r].replay.empty()) return false;
    try {
      if (!s.dealer) {
        s.dealer = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
        s.dealer->set(zmq::sockopt::linger, 0);
        s.dealer->set(zmq::sockopt::rcvhwm, 0);  // a whole replay buffer may come at once: none dropped here
        s.dealer->set(zmq::sockopt::maxmsgsize, kMaxMessageBytes);
        s.dealer->connect(eps[r].replay);
      }
      unsigned char start[8];
      encode_seq(s.expected, start);
      std::array<zmq::const_buffer, 2> req = {zmq::const_buffer("", 0), zmq::buffer(start, 8)};
      if (!zmq::send_multipart(*s.dealer, req, zmq::send_flags::dontwait)) throw zmq::error_t();
      const auto deadline = Clock::now() + std::chrono::duration<double>(replay_timeout_s);
      while (!stop) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        if (left.count() <= 0) break;
        zmq::pollitem_t item{static_cast<void*>(*s.dealer), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::min(left, std::chrono::milliseconds(100)));
        if (!(item.revents & ZMQ_POLLIN)) continue;
        std::vector<zmq::message_t> parts;
        if (!zmq::recv_multipart(*s.dealer, std::back_inserter(parts), zmq::recv_flags::dontwait)) continue;
        if (parts.size() != 3 || parts[0].size() != 0 || parts[1].size() != 8) {
          ++counters[r].malformed;
          warn(r, "a malformed replay answer (" + std::to_string(parts.size()) + " parts)");
          continue;
        }
        const uint64_t seq = *decode_seq(parts[1].data(), 8);
        if (seq == UINT64_MAX) return true;  // the end marker (-1)
        ordered(r, seq, parts[2]);
      }
    } catch (const zmq::error_t& e) {
      warn(r, std::string("replay failed: ") + e.what());
    }
    // No (complete) answer: a fresh socket, so a late answer is not read as the next one's.
    s.dealer.reset();
    ++counters[r].replay_failures;
    return false;
  }

  void on_message(size_t r, std::vector<zmq::message_t>& parts) {
    StreamState& s = streams[r];
    ++counters[r].messages;
    if (parts.size() != 3 || parts[1].size() != 8) {
      ++counters[r].malformed;
      warn(r, "a message of " + std::to_string(parts.size()) + " parts (topic, 8-byte sequence, payload expected)");
      return;
    }
    const uint64_t seq = *decode_seq(parts[1].data(), 8);
    if (s.last_sub && seq <= *s.last_sub) {  // the publisher counts from 0 again: a new process
      ++counters[r].drop_restart;
      PAGODA_LOG_INFO("router: kv events of %s restart at %llu: its entries are dropped", eps[r].events.c_str(),
                      static_cast<unsigned long long>(seq));
      clear(r);
      s.expected = 0;
    }
    s.last_sub = seq;
    if (seq > s.expected) {
      const uint64_t lost_before = counters[r].gaps_lost.load();
      replay(r);
      if (seq <= s.expected) {
        if (counters[r].gaps_lost.load() == lost_before) ++counters[r].gaps_recovered;
        if (seq < s.expected) return;  // the replay covered this message too
      }
    }
    ordered(r, seq, parts[2]);
  }

  void take_pending(size_t r) {
    const int p = pending[r].exchange(kNone);
    if (p == kNone) return;
    StreamState& s = streams[r];
    s.last_sub.reset();
    s.expected = 0;
    if (p == kResync) {
      clear(r);
      replay(r);
    }
  }

  void loop() {
    std::vector<zmq::pollitem_t> items;
    for (auto& sub : subs) items.push_back({static_cast<void*>(sub), 0, ZMQ_POLLIN, 0});
    while (!stop) {
      try {
        for (size_t r = 0; r < subs.size(); ++r) take_pending(r);
        zmq::poll(items.data(), items.size(), std::chrono::milliseconds(50));
        for (size_t r = 0; r < subs.size() && !stop; ++r) {
          if (!(items[r].revents & ZMQ_POLLIN)) continue;
          for (int n = 0; n < 256; ++n) {  // a burst at a time, then the other replicas
            std::vector<zmq::message_t> parts;
            if (!zmq::recv_multipart(subs[r], std::back_inserter(parts), zmq::recv_flags::dontwait)) break;
            on_message(r, parts);
          }
        }
      } catch (const zmq::error_t& e) {
        if (stop) break;
        PAGODA_LOG_ERROR("router: kv event subscriber: %s", e.what());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  }
};

KvSubscriber::KvSubscriber(std::vector<KvEventEndpoints> endpoints, double replay_timeout_s)
    : impl_(std::make_unique<Impl>(std::move(endpoints), replay_timeout_s)) {}

KvSubscriber::~KvSubscriber() {
  impl_->stop = true;
  if (impl_->thread.joinable()) impl_->thread.join();
}

Status KvSubscriber::start() {
  Impl& m = *impl_;
  try {
    for (const auto& ep : m.eps) {
      zmq::socket_t sub(m.ctx, zmq::socket_type::sub);
      sub.set(zmq::sockopt::linger, 0);
      sub.set(zmq::sockopt::rcvhwm, 100000);
      sub.set(zmq::sockopt::maxmsgsize, kMaxMessageBytes);  // a larger frame closes the connection
      sub.set(zmq::sockopt::subscribe, "");  // every topic
      sub.connect(ep.events);
      m.subs.push_back(std::move(sub));
    }
  } catch (const zmq::error_t& e) {
    return make_error(std::string("--kv-events-endpoint: ") + e.what());
  }
  m.thread = std::thread([&m] { m.loop(); });
  return Status::Ok();
}

void KvSubscriber::drop(int replica) {
  Impl& m = *impl_;
  m.clear(static_cast<size_t>(replica));
  ++m.counters[static_cast<size_t>(replica)].drop_unhealthy;
  int expect = kNone;
  m.pending[static_cast<size_t>(replica)].compare_exchange_strong(expect, kReset);
}

void KvSubscriber::resync(int replica) { impl_->pending[static_cast<size_t>(replica)] = kResync; }

int KvSubscriber::block_size() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->index.block_size();
}

std::vector<PrefixMatch> KvSubscriber::match(const std::vector<int32_t>& prompt, std::vector<uint64_t>* chain) const {
  const int bs = block_size();
  if (bs == 0) return {};
  std::vector<uint64_t> keys = router_chain(prompt, bs);  // hashed outside the lock
  std::vector<PrefixMatch> out;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    out = impl_->index.match(keys);
  }
  if (chain) *chain = std::move(keys);
  return out;
}

size_t KvSubscriber::entries(int replica, KvMedium m) const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->index.entries(replica, m);
}

std::string KvSubscriber::render_metrics(const std::vector<std::string>& labels) const {
  const Impl& m = *impl_;
  std::string out;
  auto head = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto line = [&](const char* name, const std::string& l, double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    out += std::string(name) + "{" + l + "} " + buf + "\n";
  };
  std::vector<std::array<size_t, kNumKvMedia>> blocks(m.eps.size());
  size_t hashes = 0;
  int bs = 0;
  {
    std::lock_guard<std::mutex> l(m.mu);
    for (size_t r = 0; r < m.eps.size(); ++r)
      for (size_t k = 0; k < kNumKvMedia; ++k) blocks[r][k] = m.index.entries(static_cast<int>(r), KvMedium(k));
    hashes = m.index.distinct_hashes();
    bs = m.index.block_size();
  }
  head("pagoda:router_kv_index_blocks", "gauge", "Blocks the KV event index holds per replica and medium.");
  for (size_t r = 0; r < m.eps.size(); ++r)
    for (size_t k = 0; k < kNumKvMedia; ++k)
      line("pagoda:router_kv_index_blocks", labels[r] + ",medium=\"" + kv_medium_name(KvMedium(k)) + "\"",
           double(blocks[r][k]));
  head("pagoda:router_kv_index_hashes", "gauge", "Distinct router block hashes in the KV event index.");
  out += "pagoda:router_kv_index_hashes " + std::to_string(hashes) + "\n";
  head("pagoda:router_kv_block_size", "gauge", "Block size learned from the KV events (0: none yet).");
  out += "pagoda:router_kv_block_size " + std::to_string(bs) + "\n";
  head("pagoda:router_kv_messages_total", "counter", "KV event messages received on the SUB socket.");
  for (size_t r = 0; r < m.eps.size(); ++r) line("pagoda:router_kv_messages_total", labels[r], double(m.counters[r].messages));
  head("pagoda:router_kv_events_total", "counter", "KV events applied to the index.");
  for (size_t r = 0; r < m.eps.size(); ++r) line("pagoda:router_kv_events_total", labels[r], double(m.counters[r].events));
  head("pagoda:router_kv_gaps_total", "counter",
       "Sequence gaps: recovered through the replay socket, or lost (the replica's entries dropped).");
  for (size_t r = 0; r < m.eps.size(); ++r) {
    line("pagoda:router_kv_gaps_total", labels[r] + ",outcome=\"recovered\"", double(m.counters[r].gaps_recovered));
    line("pagoda:router_kv_gaps_total", labels[r] + ",outcome=\"lost\"", double(m.counters[r].gaps_lost));
  }
  head("pagoda:router_kv_replay_failures_total", "counter", "Replay requests that got no complete answer in time.");
  for (size_t r = 0; r < m.eps.size(); ++r)
    line("pagoda:router_kv_replay_failures_total", labels[r], double(m.counters[r].replay_failures));
  head("pagoda:router_kv_replica_drops_total", "counter",
       "Times a replica's index entries were dropped: unhealthy (health check failed), restart (its "
       "sequence started over), cleared (AllBlocksCleared).");
  for (size_t r = 0; r < m.eps.size(); ++r) {
    line("pagoda:router_kv_replica_drops_total", labels[r] + ",reason=\"unhealthy\"", double(m.counters[r].drop_unhealthy));
    line("pagoda:router_kv_replica_drops_total", labels[r] + ",reason=\"restart\"", double(m.counters[r].drop_restart));
    line("pagoda:router_kv_replica_drops_total", labels[r] + ",reason=\"cleared\"", double(m.counters[r].drop_cleared));
  }
  head("pagoda:router_kv_rejected_total", "counter",
       "What the index did not take: malformed messages, refused events (another block size), orphan "
       "blocks (stored under a parent the index does not hold).");
  for (size_t r = 0; r < m.eps.size(); ++r) {
    line("pagoda:router_kv_rejected_total", labels[r] + ",reason=\"malformed\"", double(m.counters[r].malformed));
    line("pagoda:router_kv_rejected_total", labels[r] + ",reason=\"block_size\"", double(m.counters[r].refused));
    line("pagoda:router_kv_rejected_total", labels[r] + ",reason=\"orphan\"", double(m.counters[r].orphans));
  }
  return out;
}

}  // namespace pagoda::router
