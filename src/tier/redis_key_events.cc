#include "tier/redis_key_events.h"

#include <hiredis.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "base/log.h"

namespace pagoda::tier {

namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

std::string str_of(const redisReply* r) {
  return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_ERROR) && r->str
             ? std::string(r->str, r->len)
             : std::string();
}

}  // namespace

RedisKeyEvents::RedisKeyEvents(std::string key_prefix, int timeout_ms)
    : prefix_(std::move(key_prefix)), timeout_ms_(timeout_ms) {}

RedisKeyEvents::~RedisKeyEvents() {
  for (Sub& s : subs_) {
    if (s.c) redisFree(s.c);
  }
}

std::string RedisKeyEvents::missing_flags(const std::string& current) {
  // E: key-event channels; x: expired; e: evicted. "A" = "g$lshzxet" (and d, m
  // in newer servers): x and e, not E.
  const bool all = current.find('A') != std::string::npos;
  std::string missing;
  if (current.find('E') == std::string::npos) missing += 'E';
  if (!all && current.find('x') == std::string::npos) missing += 'x';
  if (!all && current.find('e') == std::string::npos) missing += 'e';
  return missing;
}

void RedisKeyEvents::fail(Sub& s, const char* what) {
  if (!s.logged_down) {
    PAGODA_LOG_WARN("kv redis tier %s:%d: keyspace notifications: %s; expiries are reported by the tier's clock "
                    "until it is subscribed again",
                    s.host.c_str(), s.port, what);
    s.logged_down = true;
  }
  if (s.c) {
    redisFree(s.c);
    s.c = nullptr;
  }
  s.notifying = false;
  s.backoff_ms = std::min(5000, std::max(50, s.backoff_ms * 2));
  s.retry_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(s.backoff_ms);
}

bool RedisKeyEvents::subscribe(Sub& s) {
  if (std::chrono::steady_clock::now() < s.retry_at) return false;
  timeval tv{timeout_ms_ / 1000, (timeout_ms_ % 1000) * 1000};
  s.c = redisConnectWithTimeout(s.host.c_str(), s.port, tv);
  if (s.c == nullptr || s.c->err) {
    fail(s, s.c ? s.c->errstr : "cannot connect");
    return false;
  }
  redisSetTimeout(s.c, tv);
  // The server's flags first: what it lacks of "Exe" is added, the rest kept.
  std::string why;
  ReplyPtr got(static_cast<redisReply*>(redisCommand(s.c, "CONFIG GET notify-keyspace-events")));
  if (!got) {
    fail(s, s.c->errstr[0] ? s.c->errstr : "no reply");
    return false;
  }
  if (got->type == REDIS_REPLY_ARRAY && got->elements == 2) {
    const std::string current = str_of(got->element[1]);
    const std::string missing = missing_flags(current);
    if (missing.empty()) {
      s.notifying = true;
    } else {
      const std::string want = current + missing;
      ReplyPtr set(static_cast<redisReply*>(redisCommand(s.c, "CONFIG SET notify-keyspace-events %s", want.c_str())));
      if (!set) {
        fail(s, s.c->errstr[0] ? s.c->errstr : "no reply");
        return false;
      }
      if (set->type == REDIS_REPLY_STATUS) {
        s.notifying = true;
        PAGODA_LOG_INFO("kv redis tier %s:%d: notify-keyspace-events set to '%s' (was '%s') for KV events",
                        s.host.c_str(), s.port, want.c_str(), current.c_str());
      } else {
        why = "CONFIG SET notify-keyspace-events " + want + ": " + str_of(set.get());
      }
    }
  } else {
    why = "CONFIG GET notify-keyspace-events: " + str_of(got.get());
  }
  if (!s.notifying && !s.logged_config) {
    PAGODA_LOG_WARN("kv redis tier %s:%d: cannot enable keyspace notifications (%s): set notify-keyspace-events "
                    "to include 'Exe' on the server; until then expiries are reported by the tier's own clock and "
                    "keys Redis evicts are not seen",
                    s.host.c_str(), s.port, why.c_str());
    s.logged_config = true;
  }
  // Subscribed whatever the flags: an operator may have set them where CONFIG is refused.
  ReplyPtr sub(static_cast<redisReply*>(
      redisCommand(s.c, "PSUBSCRIBE __keyevent@*__:expired __keyevent@*__:evicted")));
  if (!sub || sub->type != REDIS_REPLY_ARRAY) {
    fail(s, sub ? "PSUBSCRIBE refused" : (s.c->errstr[0] ? s.c->errstr : "no reply"));
    return false;
  }
  if (s.logged_down) PAGODA_LOG_INFO("kv redis tier %s:%d: keyspace notifications subscribed again", s.host.c_str(), s.port);
  s.logged_down = false;
  s.backoff_ms = 0;
  return true;
}

bool RedisKeyEvents::drain(Sub& s, std::vector<std::string>* names) {
  auto take = [&]() -> bool {  // the replies the reader holds
    for (;;) {
      void* raw = nullptr;
      if (redisReaderGetReply(s.c->reader, &raw) != REDIS_OK) return false;
      if (raw == nullptr) return true;
      ReplyPtr r(static_cast<redisReply*>(raw));
      // ["pmessage", pattern, channel, key]; psubscribe confirmations are skipped.
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 4 || str_of(r->element[0]) != "pmessage") continue;
      const std::string key = str_of(r->element[3]);
      if (key.size() > prefix_.size() && key.compare(0, prefix_.size(), prefix_) == 0)
        names->push_back(key.substr(prefix_.size()));
    }
  };
  if (!take()) return false;
  // Bounded: a storm of evictions is read over several sweeps, not one.
  for (int round = 0; round < 256; ++round) {
    pollfd p{s.c->fd, POLLIN, 0};
    const int n = ::poll(&p, 1, 0);
    if (n == 0) return true;
    if (n < 0) return errno == EINTR;
    if (!(p.revents & POLLIN)) return false;  // an error or a hang-up with nothing to read
    if (redisBufferRead(s.c) != REDIS_OK) return false;  // EOF: the server went away
    if (!take()) return false;
  }
  return true;
}

bool RedisKeyEvents::poll(const std::vector<std::pair<std::string, int>>& nodes, std::vector<std::string>* names) {
  // Nodes no longer listed (a cluster's map changed) are closed; new ones added.
  for (auto it = subs_.begin(); it != subs_.end();) {
    const bool listed = std::any_of(nodes.begin(), nodes.end(),
                                    [&](const auto& n) { return n.first == it->host && n.second == it->port; });
    if (listed) {
      ++it;
      continue;
    }
    if (it->c) redisFree(it->c);
    it = subs_.erase(it);
  }
  for (const auto& node : nodes) {
    // Not a structured binding: clang 14 (the fuzz preset) cannot capture one in a lambda.
    const bool have =
        std::any_of(subs_.begin(), subs_.end(), [&](const Sub& s) { return s.host == node.first && s.port == node.second; });
    if (!have) {
      Sub s;
      s.host = node.first;
      s.port = node.second;
      subs_.push_back(std::move(s));
    }
  }
  bool live = !subs_.empty();
  for (Sub& s : subs_) {
    if (!s.c && !subscribe(s)) {
      live = false;
      continue;
    }
    if (!drain(s, names)) {
      fail(s, s.c && s.c->errstr[0] ? s.c->errstr : "the connection closed");
      live = false;
      continue;
    }
    live = live && s.notifying;
  }
  return live;
}

}  // namespace pagoda::tier
