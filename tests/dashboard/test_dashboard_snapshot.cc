// Engine::snapshot and the dashboard's encodings: exact block states, owners,
// tables, prefix-tree hit counts and waiting reasons after known operations on
// the real stories260K engine, then the bytes the page decodes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/dashboard.h"

namespace pagoda {
namespace {

using engine::BlockState;
using engine::DashboardSnapshot;

std::unique_ptr<engine::Engine> make(int usable_blocks, int max_num_seqs) {
  engine::EngineConfig c;
  c.model_path = std::string(PAGODA_TEST_DATA) + "/stories260K.gguf";
  c.threads = 1;
  c.block_size = 16;
  c.num_kv_blocks = usable_blocks + 1;
  c.max_num_seqs = max_num_seqs;
  c.watermark = 0;
  auto e = engine::Engine::create(c);
  EXPECT_TRUE(e.ok()) << e.message();
  return e.ok() ? std::move(e).value() : nullptr;
}

engine::RequestParams greedy(std::vector<int32_t> prompt, int max_tokens, int n = 1) {
  engine::RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.temperature = 0;
  p.ignore_eos = true;
  p.n = n;
  return p;
}

std::vector<int32_t> tokens(int n, int first) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(first + i);
  return t;
}

// The states as a string, one letter per block: N null, F free, U used, C cached,
// O another tenant's.
std::string states(const DashboardSnapshot& s) {
  std::string out;
  for (uint8_t b : s.block_state) out += "FUCTNO"[b];
  return out;
}

DashboardSnapshot take(const engine::Engine& e) {
  DashboardSnapshot s;
  e.snapshot(&s, {});
  return s;
}

TEST(DashboardSnapshot, BlockStatesOwnersTablesAndHits) {
  auto e = make(10, 1);
  ASSERT_TRUE(e);
  // A: 40 tokens (2 full blocks + 8); B shares A's first 32 tokens.
  std::vector<int32_t> a = tokens(40, 10), b = tokens(32, 10);
  for (int32_t t : tokens(8, 200)) b.push_back(t);
  auto ida = e->add_request(greedy(a, 3));
  auto idb = e->add_request(greedy(b, 2));
  ASSERT_TRUE(ida.ok() && idb.ok());

  DashboardSnapshot s = take(*e);
  EXPECT_EQ(states(s), "NFFFFFFFFFF");
  EXPECT_EQ(s.block_size, 16);
  ASSERT_EQ(s.requests.size(), 2u);
  EXPECT_EQ(s.requests[0].id, *ida);
  EXPECT_EQ(s.requests[0].state, "waiting");
  EXPECT_EQ(s.requests[0].why, "admitted at the next step");
  EXPECT_EQ(s.requests[0].num_cached_tokens, -1);
  EXPECT_TRUE(s.requests[0].block_tables.empty());
  EXPECT_EQ(s.requests[1].why, "queued behind 1 request(s)");
  EXPECT_TRUE(s.prefix_nodes.empty());

  e->step();  // A: admitted, prefill of 40 tokens into blocks 1, 2, 3; 1 and 2 are full and committed
  s = take(*e);
  EXPECT_EQ(states(s), "NUUUFFFFFFF");
  EXPECT_EQ(s.block_owner, (std::vector<int32_t>{-1, 0, 0, 0, -1, -1, -1, -1, -1, -1, -1}));
  ASSERT_EQ(s.requests.size(), 2u);
  EXPECT_EQ(s.requests[0].state, "running");
  EXPECT_EQ(s.requests[0].why, "");
  EXPECT_EQ(s.requests[0].num_computed_tokens, 40);
  EXPECT_EQ(s.requests[0].num_output_tokens, 1);
  EXPECT_EQ(s.requests[0].num_cached_tokens, 0);
  EXPECT_EQ(s.requests[0].block_tables, (std::vector<std::vector<int32_t>>{{1, 2, 3}}));
  EXPECT_EQ(s.requests[1].state, "waiting");
  EXPECT_EQ(s.requests[1].why, "max_num_seqs (1) requests running");
  EXPECT_EQ(s.num_running, 1);
  EXPECT_EQ(s.num_waiting, 1);
  ASSERT_EQ(s.prefix_nodes.size(), 2u);
  EXPECT_EQ(s.prefix_nodes[0].block, 1);
  EXPECT_EQ(s.prefix_nodes[0].parent_block, -1);
  EXPECT_EQ(s.prefix_nodes[0].depth, 0);
  EXPECT_EQ(s.prefix_nodes[1].block, 2);
  EXPECT_EQ(s.prefix_nodes[1].parent_block, 1);
  EXPECT_EQ(s.prefix_nodes[1].depth, 1);
  EXPECT_EQ(s.prefix_nodes[1].hits, 0);
  EXPECT_TRUE(s.prefix_nodes[1].in_use);
  EXPECT_EQ(e->cached_block_tokens(2), tokens(16, 26));
  EXPECT_TRUE(e->cached_block_tokens(3).empty());  // partial: no prefix key
  EXPECT_TRUE(e->cached_block_tokens(0).empty());
  EXPECT_TRUE(e->cached_block_tokens(11).empty());

  e->step();
  e->step();  // A's third token: A finishes, its blocks go back (1, 2 keep their keys)
  s = take(*e);
  EXPECT_EQ(states(s), "NCCFFFFFFFF");
  ASSERT_EQ(s.requests.size(), 1u);
  EXPECT_EQ(s.requests[0].id, *idb);
  EXPECT_EQ(s.requests[0].why, "admitted at the next step");
  EXPECT_EQ(s.blocks_cached, 2);
  EXPECT_EQ(s.generation_tokens_total, 3);

  e->step();  // B: hits blocks 1 and 2 (32 tokens), takes block 4 (the free queue's head) for the rest
  s = take(*e);
  EXPECT_EQ(states(s), "NUUFUFFFFFF");
  ASSERT_EQ(s.requests.size(), 1u);
  EXPECT_EQ(s.requests[0].block_tables, (std::vector<std::vector<int32_t>>{{1, 2, 4}}));
  EXPECT_EQ(s.requests[0].num_cached_tokens, 32);
  EXPECT_EQ(s.requests[0].num_computed_tokens, 40);
  ASSERT_EQ(s.prefix_nodes.size(), 2u);
  EXPECT_EQ(s.prefix_nodes[0].hits, 1);
  EXPECT_EQ(s.prefix_nodes[1].hits, 1);
  EXPECT_EQ(s.prefix_hits_tokens, 32);

  // The grid bytes and the JSON the page reads.
  EXPECT_EQ(server::grid_codes(s),
            (std::vector<uint8_t>{server::kGridNull, 6, 6, 0, 6, 0, 0, 0, 0, 0, 0}));
  auto j = nlohmann::json::parse(server::snapshot_json(s, {"cmpl-b"}, 1.5));
  EXPECT_EQ(j["grid"], "AwYGAAYAAAAAAAA=");
  EXPECT_EQ(j["num_blocks"], 11);
  EXPECT_EQ(j["requests"][0]["tag"], "cmpl-b");
  EXPECT_EQ(j["requests"][0]["tables"], nlohmann::json::parse("[[1,2,4]]"));
  EXPECT_EQ(j["requests"][0]["colour"], 6);
  EXPECT_EQ(j["prefix"]["nodes"], nlohmann::json::parse("[[1,-1,1,0,1],[2,1,1,1,1]]"));
  EXPECT_EQ(j["counters"]["prefix_hits"], 32);
}

TEST(DashboardSnapshot, ForkedChoicesShareBlocks) {
  auto e = make(10, 4);
  ASSERT_TRUE(e);
  auto id = e->add_request(greedy(tokens(20, 10), 4, /*n=*/2));
  ASSERT_TRUE(id.ok());
  e->step();  // prefill, then the fork: both choices hold blocks 1 and 2
  DashboardSnapshot s = take(*e);
  ASSERT_EQ(s.requests.size(), 2u);
  EXPECT_EQ(s.requests[0].id, *id);
  EXPECT_EQ(s.requests[1].id, *id);
  EXPECT_EQ(s.requests[0].index + s.requests[1].index, 1);
  EXPECT_EQ(s.requests[0].block_tables, s.requests[1].block_tables);
  EXPECT_EQ(s.block_owner[1], -2);
  EXPECT_EQ(server::grid_codes(s)[1], server::kGridShared);
}

// One tenant's view (issue 35): a server with per-key salts asks for the
// requests and blocks under its key's salt prefix only.
DashboardSnapshot take_tenant(const engine::Engine& e, const std::string& prefix) {
  engine::SnapshotOptions o;
  o.only_tenant = true;
  o.tenant_salt_prefix = prefix;
  DashboardSnapshot s;
  e.snapshot(&s, o);
  return s;
}

std::vector<int32_t> node_blocks(const DashboardSnapshot& s) {
  std::vector<int32_t> out;
  for (const auto& n : s.prefix_nodes) out.push_back(n.block);
  return out;
}

TEST(DashboardSnapshot, TenantSeesOnlyItsRequestsBlocksAndTree) {
  auto e = make(12, 4);
  ASSERT_TRUE(e);
  engine::RequestParams a = greedy(tokens(40, 10), 3), b = greedy(tokens(24, 100), 3);
  a.cache_salt = "tagA/user-salt";  // the server's key tag, then the request's own salt
  b.cache_salt = "tagB/";
  auto ida = e->add_request(a);
  auto idb = e->add_request(b);
  ASSERT_TRUE(ida.ok() && idb.ok());
  // Waiting: each tenant lists only its own request.
  DashboardSnapshot sa = take_tenant(*e, "tagA/"), sb = take_tenant(*e, "tagB/");
  ASSERT_EQ(sa.requests.size(), 1u);
  EXPECT_EQ(sa.requests[0].id, *ida);
  EXPECT_EQ(sa.requests[0].why, "admitted at the next step");
  ASSERT_EQ(sb.requests.size(), 1u);
  EXPECT_EQ(sb.requests[0].id, *idb);
  EXPECT_EQ(sb.requests[0].why, "queued behind 1 request(s)");  // its place in the one queue

  e->step();  // both admitted: A in blocks 1, 2, 3 (1, 2 committed), B in 4, 5 (4 committed)
  EXPECT_EQ(states(take(*e)), "NUUUUUFFFFFFF");
  sa = take_tenant(*e, "tagA/");
  sb = take_tenant(*e, "tagB/");
  EXPECT_EQ(states(sa), "NUUUOOFFFFFFF");
  EXPECT_EQ(states(sb), "NOOOUUFFFFFFF");
  ASSERT_EQ(sa.requests.size(), 1u);
  EXPECT_EQ(sa.requests[0].block_tables, (std::vector<std::vector<int32_t>>{{1, 2, 3}}));
  ASSERT_EQ(sb.requests.size(), 1u);
  EXPECT_EQ(sb.requests[0].block_tables, (std::vector<std::vector<int32_t>>{{4, 5}}));
  EXPECT_EQ(node_blocks(sa), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(node_blocks(sb), (std::vector<int32_t>{4}));
  EXPECT_EQ(sa.prefix_cached_blocks, 2);
  EXPECT_EQ(sb.prefix_cached_blocks, 1);
  // Another tenant's blocks have no owner and no colour of a request.
  EXPECT_EQ(sa.block_owner[4], -1);
  EXPECT_EQ(server::grid_codes(sa)[4], server::kGridUsedUnknown);
  EXPECT_EQ(server::grid_codes(sa)[1], server::kGridRequest0);
  EXPECT_EQ(e->cached_block_salt(1), "tagA/user-salt");
  EXPECT_EQ(e->cached_block_salt(4), "tagB/");
  EXPECT_EQ(e->cached_block_salt(3), "");  // partial: not cached

  for (int i = 0; i < 3; ++i) e->step();  // both finish; 1, 2 and 4 stay cached
  EXPECT_EQ(states(take(*e)), "NCCFCFFFFFFFF");
  sa = take_tenant(*e, "tagA/");
  sb = take_tenant(*e, "tagB/");
  EXPECT_EQ(states(sa), "NCCFOFFFFFFFF");
  EXPECT_EQ(states(sb), "NOOFCFFFFFFFF");
  EXPECT_TRUE(sa.requests.empty());
  EXPECT_EQ(node_blocks(sa), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(node_blocks(sb), (std::vector<int32_t>{4}));
  // A third tenant sees nothing of either; the unfiltered view (an admin) sees all.
  DashboardSnapshot sc = take_tenant(*e, "tagC/");
  EXPECT_EQ(states(sc), "NOOFOFFFFFFFF");
  EXPECT_TRUE(sc.prefix_nodes.empty());
  EXPECT_EQ(sc.prefix_cached_blocks, 0);
  EXPECT_EQ(node_blocks(take(*e)), (std::vector<int32_t>{1, 4, 2}));
  // The counters stay the pool's (what /metrics shows every key).
  EXPECT_EQ(sc.blocks_cached, 3);
}

TEST(DashboardEncode, Base64AndQuery) {
  const uint8_t d[] = {0, 1, 2, 255, 1, 2};
  EXPECT_EQ(server::base64_encode(d, 3), "AAEC");
  EXPECT_EQ(server::base64_encode(d + 3, 1), "/w==");
  EXPECT_EQ(server::base64_encode(d + 4, 2), "AQI=");
  EXPECT_EQ(server::base64_encode(d, 0), "");
  EXPECT_EQ(server::query_param("hz=10&key=a%2Fb+c", "key"), "a/b c");
  EXPECT_EQ(server::query_param("hz=10&key=a%2Fb+c", "hz"), "10");
  EXPECT_EQ(server::query_param("hz=10&keys=1", "key"), "");
  EXPECT_EQ(server::query_param("", "key"), "");
  EXPECT_EQ(server::query_param("key=%zz", "key"), "%zz");
}

TEST(DashboardEncode, SeriesAndReport) {
  server::SeriesPoint p;
  p.t = 0.25;
  p.blocks_used = 3;
  p.blocks_total = 10;
  p.generation_tokens = 7;
  EXPECT_EQ(server::series_json({p}), "[[0.250,3,10,0,0,0,0,0,0,7,0]]");
  const std::string html = server::report_html("bench </script>", {p}, "{\"x\":1}");
  EXPECT_NE(html.find("const REPORT = {\"title\":\"bench <\\/script>\",\"series\":[[0.250,3,10,0,0,0,0,0,0,7,0]],"
                      "\"summary\":{\"x\":1}};"),
            std::string::npos);
  EXPECT_EQ(html.find("/*@"), std::string::npos);  // every placeholder filled
  EXPECT_NE(html.find("function drawAllCharts"), std::string::npos);
  EXPECT_EQ(server::dashboard_page().find("/*@"), std::string::npos);
}

}  // namespace
}  // namespace pagoda
