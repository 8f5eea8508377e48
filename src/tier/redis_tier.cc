#include "tier/redis_tier.h"

#include <hiredis.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "base/log.h"

namespace pagoda::tier {

namespace {

constexpr int kSlots = 16384;
constexpr int kMaxRedirects = 5;

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

bool parse_host_port(std::string_view s, std::string* host, int* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 >= s.size()) return false;
  int p = 0;
  for (char c : s.substr(colon + 1)) {
    if (c < '0' || c > '9' || p > 65535) return false;
    p = p * 10 + (c - '0');
  }
  if (p < 1 || p > 65535) return false;
  host->assign(s.substr(0, colon));
  *port = p;
  return true;
}

}  // namespace

Expected<std::vector<std::pair<std::string, int>>> parse_redis_url(const std::string& url) {
  std::string_view s = url;
  if (s.rfind("redis://", 0) == 0) s.remove_prefix(8);
  std::vector<std::pair<std::string, int>> out;
  while (!s.empty()) {
    const size_t comma = s.find(',');
    const std::string_view part = s.substr(0, comma);
    std::string host;
    int port = 0;
    if (!parse_host_port(part, &host, &port)) {
      return errorf("--kv-redis: '%.*s' is not HOST:PORT (expected redis://HOST:PORT[,HOST:PORT...])",
                    static_cast<int>(part.size()), part.data());
    }
    out.emplace_back(host, port);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  if (out.empty()) return errorf("--kv-redis: no HOST:PORT in '%s'", url.c_str());
  return out;
}

uint16_t redis_key_slot(std::string_view key) {
  // Only the part inside the first {...} is hashed when it is non-empty.
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  uint16_t crc = 0;
  for (unsigned char c : key) {
    crc ^= static_cast<uint16_t>(c << 8);
    for (int i = 0; i < 8; ++i) crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : static_cast<uint16_t>(crc << 1);
  }
  return static_cast<uint16_t>(crc % kSlots);
}

RedisTier::RedisTier(RedisTierOptions opt) : opt_(std::move(opt)), slot_node_(kSlots, -1) {
  for (const auto& [host, port] : opt_.seeds) node_index(host, port);
  discover(false);  // down at start is fine: each call tries again after the backoff
  if (opt_.key_events) {
    key_events_ = std::make_unique<RedisKeyEvents>(opt_.key_prefix, opt_.timeout_ms);
    std::vector<std::string> none;
    key_events_->poll(notify_nodes(), &none);  // subscribed before the first store
  }
}

RedisTier::~RedisTier() {
  for (Node& n : nodes_) {
    if (n.c) redisFree(n.c);
  }
}

int RedisTier::node_index(const std::string& host, int port) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].host == host && nodes_[i].port == port) return static_cast<int>(i);
  }
  Node n;
  n.host = host;
  n.port = port;
  nodes_.push_back(std::move(n));
  return static_cast<int>(nodes_.size() - 1);
}

void RedisTier::fail(Node& n, const char* what) {
  if (!n.logged_down) {
    PAGODA_LOG_WARN("kv redis tier %s:%d: %s; retrying with backoff, serving goes on", n.host.c_str(), n.port, what);
    n.logged_down = true;
  }
  if (n.c) {
    redisFree(n.c);
    n.c = nullptr;
  }
  n.backoff_ms = std::min(5000, std::max(50, n.backoff_ms * 2));
  n.retry_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(n.backoff_ms);
}

bool RedisTier::connect(Node& n) {
  if (n.c) return true;
  if (std::chrono::steady_clock::now() < n.retry_at) return false;
  timeval tv{opt_.timeout_ms / 1000, (opt_.timeout_ms % 1000) * 1000};
  n.c = redisConnectWithTimeout(n.host.c_str(), n.port, tv);
  if (n.c == nullptr || n.c->err) {
    fail(n, n.c ? n.c->errstr : "cannot connect");
    return false;
  }
  redisSetTimeout(n.c, tv);
  if (n.logged_down) PAGODA_LOG_INFO("kv redis tier %s:%d: connected again", n.host.c_str(), n.port);
  n.logged_down = false;
  n.backoff_ms = 0;
  return true;
}

bool RedisTier::load_slots(const redisReply* r) {
  if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements == 0) return false;
  std::vector<int> map(kSlots, -1);
  for (size_t i = 0; i < r->elements; ++i) {
    const redisReply* e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[2]->type != REDIS_REPLY_ARRAY ||
        e->element[2]->elements < 2)
      return false;
    const long long lo = e->element[0]->integer, hi = e->element[1]->integer;
    const redisReply* master = e->element[2];
    std::string host(master->element[0]->str ? master->element[0]->str : "", master->element[0]->len);
    if (host.empty()) host = nodes_[static_cast<size_t>(single_)].host;  // "": the node that answered
    const int idx = node_index(host, static_cast<int>(master->element[1]->integer));
    for (long long s = std::max(0ll, lo); s <= std::min<long long>(kSlots - 1, hi); ++s) map[static_cast<size_t>(s)] = idx;
  }
  slot_node_ = std::move(map);
  return true;
}

bool RedisTier::discover(bool refresh) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    Node& n = nodes_[i];
    if (!connect(n)) continue;
    ReplyPtr r(static_cast<redisReply*>(redisCommand(n.c, "CLUSTER SLOTS")));
    if (!r) {
      fail(n, n.c->errstr);
      continue;
    }
    single_ = static_cast<int>(i);
    if (r->type == REDIS_REPLY_ERROR && !refresh) {  // "ERR This instance has cluster support disabled"
      cluster_ = false;
    } else if (load_slots(r.get())) {
      cluster_ = true;
    } else {
      continue;  // a cluster node that knows no slots yet
    }
    if (!refresh) {
      topology_known_ = true;
      PAGODA_LOG_INFO("kv redis tier: %s via %s:%d", cluster_ ? "Redis Cluster" : "one Redis node", n.host.c_str(),
                      n.port);
    }
    return true;
  }
  return false;
}

redisReply* RedisTier::command(const std::string& key, const std::vector<std::string_view>& argv) {
  if (!topology_known_ && !discover(false)) return nullptr;
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (std::string_view a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  int target = cluster_ ? slot_node_[redis_key_slot(key)] : single_;
  bool asking = false;
  for (int attempt = 0; attempt <= kMaxRedirects; ++attempt) {
    if (target < 0) {  // a slot nobody serves (yet): ask the cluster again
      if (!discover(true)) return nullptr;
      target = slot_node_[redis_key_slot(key)];
      if (target < 0) return nullptr;
    }
    Node& n = nodes_[static_cast<size_t>(target)];
    if (!connect(n)) return nullptr;
    redisReply* raw = nullptr;
    if (asking) {
      redisAppendCommand(n.c, "ASKING");
      redisAppendCommandArgv(n.c, static_cast<int>(args.size()), args.data(), lens.data());
      void* ok = nullptr;
      if (redisGetReply(n.c, &ok) == REDIS_OK) freeReplyObject(ok);
      void* rep = nullptr;
      if (redisGetReply(n.c, &rep) == REDIS_OK) raw = static_cast<redisReply*>(rep);
    } else {
      raw = static_cast<redisReply*>(redisCommandArgv(n.c, static_cast<int>(args.size()), args.data(), lens.data()));
    }
    if (raw == nullptr) {
      fail(n, n.c && n.c->errstr[0] ? n.c->errstr : "no reply");
      if (cluster_) discover(true);  // the slot may have moved to a live node
      return nullptr;
    }
    ReplyPtr r(raw);
    asking = false;
    if (r->type == REDIS_REPLY_ERROR && r->str) {
      std::string_view e(r->str, r->len);
      const bool moved = e.rfind("MOVED ", 0) == 0, ask = e.rfind("ASK ", 0) == 0;
      if (moved || ask) {
        // "MOVED <slot> <host>:<port>"
        const size_t sp = e.rfind(' ');
        std::string host;
        int port = 0;
        if (sp == std::string_view::npos || !parse_host_port(e.substr(sp + 1), &host, &port)) return r.release();
        target = node_index(host, port);
        if (moved) {
          cluster_ = true;
          discover(true);
          slot_node_[redis_key_slot(key)] = target;
        } else {
          asking = true;
        }
        continue;
      }
    }
    return r.release();
  }
  return nullptr;
}

TierGet RedisTier::get(const std::string& name, uint64_t max_bytes) {
  TierGet g;
  const std::string key = opt_.key_prefix + name;
  // Not GET: a huge value planted under a real key would be transferred (and
  // buffered) whole before it could be rejected. GETRANGE's end is inclusive:
  // one byte past max_bytes tells a larger value apart.
  const std::string end = std::to_string(max_bytes);
  ReplyPtr r(command(key, {"GETRANGE", key, "0", end}));
  if (!r || r->type == REDIS_REPLY_ERROR) {
    g.status = TierGet::kError;
  } else if (r->type == REDIS_REPLY_STRING && r->len > 0) {  // a missing key reads as ""
    if (static_cast<uint64_t>(r->len) > max_bytes) {
      g.status = TierGet::kRejected;
    } else {
      g.status = TierGet::kHit;
      g.value.assign(r->str, r->len);
    }
  }
  return g;
}

void RedisTier::set_expiry(const std::string& name, uint64_t expiry_ms) {
  if (expiry_ms == 0) {
    expiry_.erase(name);
    return;
  }
  expiry_[name] = expiry_ms;
  by_expiry_.emplace(expiry_ms, name);
}

TierBackend::Put RedisTier::put(const std::string& name, const std::string& value, uint64_t expiry_ms) {
  const std::string key = opt_.key_prefix + name;
  const uint64_t now = unix_now_ms();
  if (expiry_ms == 0 && opt_.ttl_seconds > 0) expiry_ms = now + static_cast<uint64_t>(opt_.ttl_seconds) * 1000;
  if (expiry_ms != 0 && expiry_ms <= now) return Put::kSkipped;  // expired already
  const std::string px = std::to_string(expiry_ms - now);
  ReplyPtr r(expiry_ms != 0 ? command(key, {"SET", key, value, "PX", px}) : command(key, {"SET", key, value}));
  if (!r || r->type == REDIS_REPLY_ERROR) return Put::kError;
  set_expiry(name, expiry_ms);
  if (key_events_) held_.insert(name);
  return Put::kStored;
}

bool RedisTier::renew(const std::string& name, uint64_t expiry_ms) {
  const std::string key = opt_.key_prefix + name;
  const uint64_t now = unix_now_ms();
  if (expiry_ms <= now) return false;
  ReplyPtr r(command(key, {"PEXPIRE", key, std::to_string(expiry_ms - now)}));
  if (!r || r->type != REDIS_REPLY_INTEGER || r->integer != 1) return false;
  set_expiry(name, expiry_ms);
  return true;
}

void RedisTier::report_dropped(const std::string& name) {
  if (!key_events_ || held_.erase(name)) note_dropped(name);
}

bool RedisTier::key_missing(const std::string& name) {
  const std::string key = opt_.key_prefix + name;
  ReplyPtr r(command(key, {"EXISTS", key}));
  return r && r->type == REDIS_REPLY_INTEGER && r->integer == 0;
}

std::vector<std::pair<std::string, int>> RedisTier::notify_nodes() {
  std::vector<std::pair<std::string, int>> out;
  if (!topology_known_ && !discover(false)) return out;
  auto add = [&](int idx) {
    const Node& n = nodes_[static_cast<size_t>(idx)];
    if (std::find(out.begin(), out.end(), std::make_pair(n.host, n.port)) == out.end()) out.emplace_back(n.host, n.port);
  };
  if (cluster_) {
    for (int idx : slot_node_)
      if (idx >= 0) add(idx);
  } else {
    add(single_);
  }
  return out;
}

void RedisTier::sweep(uint64_t now_ms) {
  // Keys Redis expired or evicted, by its notifications (key_events).
  bool live = false;
  if (key_events_) {
    std::vector<std::string> gone;
    live = key_events_->poll(notify_nodes(), &gone);
    for (const std::string& name : gone) {
      // Not ours (another replica's key of the same namespace), or stored again since the notice.
      if (!held_.count(name) || !key_missing(name)) continue;
      expiry_.erase(name);
      report_dropped(name);
    }
  }
  // Keys past their expiry by this tier's clock. While notifications are live a
  // key's own notice reports it; one still held kNotifyGraceMs after its expiry
  // (renewed by another replica, or its notice lost) is asked for with EXISTS.
  constexpr uint64_t kNotifyGraceMs = 5000;
  const uint64_t grace = live ? kNotifyGraceMs : 0;
  while (!by_expiry_.empty() && by_expiry_.begin()->first + grace <= now_ms) {
    auto it = by_expiry_.begin();
    auto e = expiry_.find(it->second);
    if (e != expiry_.end() && e->second == it->first) {  // not renewed since
      // Without live notifications: Redis dropped it at its expiry. With them:
      // a key still there was renewed by another client and stays.
      if (!live || key_missing(it->second)) report_dropped(it->second);
      expiry_.erase(e);
    }
    by_expiry_.erase(it);
  }
}

void RedisTier::drop(const std::string& name) {
  const std::string key = opt_.key_prefix + name;
  ReplyPtr r(command(key, {"DEL", key}));
  expiry_.erase(name);
  report_dropped(name);  // KV events (an expiry or an eviction: sweep())
}

redisReply* RedisTier::node_command(Node& n, const std::vector<std::string_view>& argv) {
  if (!connect(n)) return nullptr;
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (std::string_view a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(redisCommandArgv(n.c, static_cast<int>(args.size()), args.data(), lens.data()));
  if (r == nullptr) fail(n, n.c && n.c->errstr[0] ? n.c->errstr : "no reply");
  return r;
}

int64_t RedisTier::clear(uint64_t ns) {
  (void)ns;  // the key prefix is this engine's namespace
  if (!topology_known_ && !discover(false)) return 0;
  // Every node that serves a slot (cluster), or the one node.
  std::vector<int> targets;
  if (cluster_) {
    for (int idx : slot_node_) {
      if (idx >= 0 && std::find(targets.begin(), targets.end(), idx) == targets.end()) targets.push_back(idx);
    }
  } else {
    targets.push_back(single_);
  }
  const std::string pattern = opt_.key_prefix + "*";
  int64_t n = 0;
  for (int idx : targets) {
    Node& node = nodes_[static_cast<size_t>(idx)];
    std::string cursor = "0";
    do {
      ReplyPtr r(node_command(node, {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}));
      if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) break;
      cursor.assign(r->element[0]->str, r->element[0]->len);
      const redisReply* keys = r->element[1];
      for (size_t i = 0; i < keys->elements; ++i) {
        const std::string key(keys->element[i]->str, keys->element[i]->len);
        ReplyPtr d(node_command(node, {"UNLINK", key}));
        if (!d || d->type != REDIS_REPLY_INTEGER || d->integer != 1) continue;
        const std::string name = key.substr(opt_.key_prefix.size());
        expiry_.erase(name);
        report_dropped(name);
        ++n;
      }
    } while (cursor != "0");
  }
  return n;
}

}  // namespace pagoda::tier
