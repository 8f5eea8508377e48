// Redis servers for the tier tests: started on free loopback ports in a temp
// directory, stopped (SIGTERM, then SIGKILL) by the destructor. Missing
// redis-server: the test skips, or fails when CI=true.
#pragma once
#include <gtest/gtest.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tier_test_util.h"

namespace pagoda::tiertest {

inline bool have_tool(const char* name) {
  return std::system((std::string("command -v ") + name + " >/dev/null 2>&1").c_str()) == 0;
}

// In a test body: skips (or fails under CI=true) when redis-server or redis-cli is missing.
#define PAGODA_REQUIRE_REDIS()                                                                      \
  do {                                                                                             \
    if (!::pagoda::tiertest::have_tool("redis-server") || !::pagoda::tiertest::have_tool("redis-cli")) { \
      const char* ci = std::getenv("CI");                                                          \
      if (ci && std::string(ci) == "true") FAIL() << "redis-server / redis-cli missing (scripts/setup installs them)"; \
      GTEST_SKIP() << "redis-server / redis-cli missing (scripts/setup installs them)";             \
    }                                                                                              \
  } while (0)

// A free loopback port (want = 0: any; else only that one, 0 when taken).
inline int free_port(int want = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(want));
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// One command to 127.0.0.1:port; nullptr when it does not answer.
struct Reply {
  redisReply* r = nullptr;
  ~Reply() {
    if (r) freeReplyObject(r);
  }
};
inline std::string redis_cmd(int port, const std::vector<std::string>& argv) {
  timeval tv{1, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c == nullptr || c->err) {
    if (c) redisFree(c);
    return "<down>";
  }
  std::vector<const char*> a;
  std::vector<size_t> l;
  for (const auto& s : argv) {
    a.push_back(s.data());
    l.push_back(s.size());
  }
  Reply rep;
  rep.r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(a.size()), a.data(), l.data()));
  std::string out;
  if (rep.r == nullptr) {
    out = "<down>";
  } else if (rep.r->type == REDIS_REPLY_INTEGER) {
    out = std::to_string(rep.r->integer);
  } else if (rep.r->type == REDIS_REPLY_ARRAY) {
    for (size_t i = 0; i < rep.r->elements; ++i) {
      if (rep.r->element[i]->str) out += std::string(rep.r->element[i]->str, rep.r->element[i]->len) + "\n";
    }
  } else if (rep.r->str) {
    out.assign(rep.r->str, rep.r->len);
  }
  redisFree(c);
  return out;
}

// A cluster node also listens on port + 10000 (the cluster bus): both free.
inline int free_cluster_port() {
  static uint32_t x = static_cast<uint32_t>(::getpid()) * 2654435761u;
  for (int i = 0; i < 1000; ++i) {
    x = x * 1664525u + 1013904223u;
    const int p = 20000 + static_cast<int>((x >> 8) % 30000);
    if (free_port(p) == p && free_port(p + 10000) == p + 10000) return p;
  }
  return 0;
}

class RedisServer {
 public:
  // cluster: a cluster-enabled node (joined by RedisCluster).
  explicit RedisServer(const std::string& dir, int port = 0, bool cluster = false)
      : dir_(dir), port_(port ? port : cluster ? free_cluster_port() : free_port()), cluster_(cluster) {
    start();
  }
  ~RedisServer() { stop(); }
  int port() const { return port_; }
  bool running() const { return pid_ > 0; }
  void start() {
    const std::string p = std::to_string(port_);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test that dies takes its servers with it
      std::vector<std::string> args = {"redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", dir_, "--loglevel", "warning"};
      if (cluster_) {
        for (const char* a : {"--cluster-enabled", "yes", "--cluster-config-file"}) args.push_back(a);
        args.push_back("nodes-" + p + ".conf");
      }
      std::vector<char*> av;
      for (auto& s : args) av.push_back(s.data());
      av.push_back(nullptr);
      ::execvp("redis-server", av.data());
      ::_exit(127);
    }
    for (int i = 0; i < 200 && redis_cmd(port_, {"PING"}) != "PONG"; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(redis_cmd(port_, {"PING"}), "PONG") << "redis-server on port " << port_ << " did not start";
  }
  // SIGKILL: the "killed mid-run" fault; SIGTERM for a clean stop.
  void stop(int sig = SIGTERM) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int status = 0;
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
  }

 private:
  std::string dir_;
  int port_;
  bool cluster_;
  pid_t pid_ = 0;
};

// Three cluster nodes, no replicas, joined with redis-cli --cluster create.
class RedisCluster {
 public:
  explicit RedisCluster(const std::string& dir) {
    std::string cmd = "redis-cli --cluster create";
    for (int i = 0; i < 3; ++i) {
      nodes_.push_back(std::make_unique<RedisServer>(dir, 0, true));
      cmd += " 127.0.0.1:" + std::to_string(nodes_.back()->port());
    }
    cmd += " --cluster-replicas 0 --cluster-yes >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    for (int i = 0; i < 250 && !ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(ok()) << "cluster did not reach cluster_state:ok";
  }
  bool ok() const {
    for (const auto& n : nodes_) {
      if (redis_cmd(n->port(), {"CLUSTER", "INFO"}).find("cluster_state:ok") == std::string::npos) return false;
    }
    return true;
  }
  RedisServer& node(int i) { return *nodes_[static_cast<size_t>(i)]; }
  std::string url() const {
    std::string u = "redis://";
    for (size_t i = 0; i < nodes_.size(); ++i) u += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(nodes_[i]->port());
    return u;
  }

 private:
  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

}  // namespace pagoda::tiertest
