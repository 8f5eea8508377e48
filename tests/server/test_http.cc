// HttpServer against raw loopback clients: a client that stops reading is dropped by
// the queued-output bound (streams) or the send timeout (one large response), its
// disconnect callback fires, and the server keeps serving others. No model needed.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "http/http.h"
#include "server/server.h"

using namespace pagoda::server;
using namespace std::chrono_literals;

namespace {

int connect_to(int port, int rcvbuf = 0) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  // A small receive buffer (set before connect, so the window is small) fills fast.
  if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    off += static_cast<size_t>(n);
  }
}

std::string read_all(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Runs an HttpServer on its own thread for one test.
struct Running {
  HttpServer srv;
  std::thread th;
  int port = 0;
  Running(HttpConfig cfg, Handler h) : srv(std::move(cfg), std::move(h)) {
    std::string err;
    EXPECT_TRUE(srv.start(&err)) << err;
    port = srv.port();
    th = std::thread([this] { srv.run(); });
  }
  ~Running() {
    srv.stop();
    th.join();
  }
};

bool wait_for(const std::atomic<bool>& flag, std::chrono::seconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!flag && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(10ms);
  return flag;
}

const char kGetStream[] = "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n";
const char kGetBig[] = "GET /big HTTP/1.1\r\nHost: x\r\n\r\n";
const char kGetOk[] = "GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

}  // namespace

TEST(Http, StreamToClientThatStopsReadingIsDroppedByQueueBound) {
  HttpConfig cfg;
  cfg.port = 0;
  cfg.max_queued_output = 1u << 20;
  cfg.send_timeout_s = 600;  // only the queue bound may act here
  std::atomic<bool> disconnected{false}, writer_done{false};
  std::thread writer;
  {
    Running r(cfg, [&](HttpRequest req, std::shared_ptr<Responder> res) {
      if (req.target == "/ok") return res->send(200, "text/plain", "ok");
      res->on_disconnect([&] { disconnected = true; });
      res->start_stream(200);
      // Far more than any socket buffers hold (<= 64 MiB), in 16 KiB chunks.
      writer = std::thread([res, &disconnected, &writer_done] {
        const std::string chunk(16384, 'x');
        for (int i = 0; i < 4096 && !disconnected; ++i) {
          res->write(chunk);
          std::this_thread::sleep_for(50us);
        }
        writer_done = true;
      });
    });
    int fd = connect_to(r.port, 4096);
    ASSERT_GE(fd, 0);
    send_all(fd, kGetStream);  // and never read
    EXPECT_TRUE(wait_for(disconnected, 60s)) << "a stalled stream client was never dropped";
    // Others are still served.
    int ok = connect_to(r.port);
    send_all(ok, kGetOk);
    EXPECT_NE(read_all(ok).find("\r\n\r\nok"), std::string::npos);
    ::close(ok);
    ::close(fd);
    wait_for(writer_done, 60s);
    writer.join();
  }
}

TEST(Http, LargeResponseToClientThatStopsReadingTimesOut) {
  HttpConfig cfg;
  cfg.port = 0;
  cfg.send_timeout_s = 1;
  std::atomic<bool> disconnected{false};
  Running r(cfg, [&](HttpRequest req, std::shared_ptr<Responder> res) {
    if (req.target == "/ok") return res->send(200, "text/plain", "ok");
    res->on_disconnect([&] { disconnected = true; });
    res->send(200, "application/octet-stream", std::string(64u << 20, 'y'));  // one queued item
  });
  int fd = connect_to(r.port, 4096);
  ASSERT_GE(fd, 0);
  send_all(fd, kGetBig);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(wait_for(disconnected, 60s)) << "a stalled client kept its write pending";
  // Not before the timeout: the kernel buffers take a few MB, then the write stalls.
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 900ms);
  int ok = connect_to(r.port);
  send_all(ok, kGetOk);
  EXPECT_NE(read_all(ok).find("\r\n\r\nok"), std::string::npos);
  ::close(ok);
  ::close(fd);
}

TEST(Http, HeadAnswersWithoutBodyAndConnectionsAreCounted) {
  HttpConfig cfg;
  cfg.port = 0;
  Running r(cfg, [&](HttpRequest req, std::shared_ptr<Responder> res) {
    res->send(200, "text/plain", "hello world");
  });
  EXPECT_GT(r.srv.max_connections(), 0);
  int fd = connect_to(r.port);
  send_all(fd, "HEAD /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  std::string out = read_all(fd);
  ::close(fd);
  EXPECT_NE(out.find("Content-Length: 11\r\n"), std::string::npos) << out;
  EXPECT_EQ(out.substr(out.find("\r\n\r\n") + 4), "");
  // Closed connections are no longer counted (the server sees the EOF promptly).
  for (int i = 0; i < 200 && r.srv.num_connections() != 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(r.srv.num_connections(), 0);
}

// Destroying the server while a stream is live: the engine's last callbacks (a
// shutdown error for every live request) post to sessions whose io_context must
// still exist, so the engine goes before the HTTP server. Run under ASan/TSan this
// is the destructor-order check.
TEST(ServerLifecycle, DestroyedWithAStreamInFlight) {
  pagoda::engine::EngineConfig ecfg;
  ecfg.model_path = std::string(PAGODA_TEST_DATA) + "/stories260K.gguf";
  ecfg.threads = 1;
  ecfg.num_kv_blocks = 64;
  auto eng = pagoda::engine::Engine::create(ecfg);
  ASSERT_TRUE(eng.ok()) << eng.message();
  ServerConfig scfg;
  scfg.http.port = 0;
  auto srv = Server::create(scfg, std::move(eng).value());
  ASSERT_TRUE(srv.ok()) << srv.message();
  auto port = (*srv)->start();
  ASSERT_TRUE(port.ok());
  std::thread th([&] { (*srv)->run(); });
  int fd = connect_to(*port);
  ASSERT_GE(fd, 0);
  const std::string body = R"({"prompt":"Once upon a time","max_tokens":400,"ignore_eos":true,"stream":true})";
  send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  char buf[4096];
  ASSERT_GT(::recv(fd, buf, sizeof(buf), 0), 0);  // the stream has started
  (*srv)->stop();
  th.join();
  srv->reset();  // engine thread joined, callbacks done, then the HTTP server
  read_all(fd);  // the connection ends (EOF or reset), nothing hangs
  ::close(fd);
}

TEST(Http, CorsAllowOrigin) {
  EXPECT_EQ(cors_allow_origin({"*"}, "http://a.example"), "*");
  EXPECT_EQ(cors_allow_origin({"http://a.example", "http://b.example"}, "http://b.example"), "http://b.example");
  EXPECT_EQ(cors_allow_origin({"http://a.example"}, "http://evil.example"), "");
  EXPECT_EQ(cors_allow_origin({}, "http://a.example"), "");
  EXPECT_EQ(cors_allow_origin({"*"}, ""), "");  // no Origin: not a cross-origin call, no header
}

namespace pagoda::server {
namespace {

// Issue 35 item 7: obs-fold and codings other than chunked are refused, not guessed at.
TEST(Http, ScanRequestHeadFindsObsFold) {
  EXPECT_EQ(scan_request_head("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), HeadScan::kComplete);
  EXPECT_EQ(scan_request_head("GET / HTTP/1.1\r\nHost: x\r\n"), HeadScan::kIncomplete);
  EXPECT_EQ(scan_request_head("GET / HTTP/1.1\r\nHost: x\r\n\r\n body may start with a space"),
            HeadScan::kComplete);
  EXPECT_EQ(scan_request_head("GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n"), HeadScan::kObsFold);
  EXPECT_EQ(scan_request_head("GET / HTTP/1.1\r\nX-A: a\r\n\tb\r\n\r\n"), HeadScan::kObsFold);
  // Seen before the head is whole: refused without waiting for the rest.
  EXPECT_EQ(scan_request_head("GET / HTTP/1.1\r\nX-A: a\r\n b"), HeadScan::kObsFold);
  EXPECT_EQ(scan_request_head("GET / HTTP/1.1\r\nX-A: a \t b\r\n\r\n"), HeadScan::kComplete);
  EXPECT_EQ(scan_request_head(""), HeadScan::kIncomplete);
}

TEST(Http, OnlyChunkedTransferEncoding) {
  EXPECT_EQ(check_transfer_encoding({}), "");
  EXPECT_EQ(check_transfer_encoding({"chunked"}), "");
  EXPECT_EQ(check_transfer_encoding({" Chunked\t"}), "");
  for (const char* te : {"gzip, chunked", "chunked, chunked", "gzip", "identity", "chunked;q=1", ""})
    EXPECT_NE(check_transfer_encoding({te}), "") << te;
  EXPECT_NE(check_transfer_encoding({"chunked", "chunked"}), "");
  EXPECT_NE(check_transfer_encoding({"gzip, chunked"}).find("gzip, chunked"), std::string::npos);
}

}  // namespace
}  // namespace pagoda::server
