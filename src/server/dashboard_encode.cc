// The dashboard's encodings: grid bytes, snapshot JSON, series, the page and
// the report (dashboard.h). No state: tested directly (tests/dashboard).
#include <cmath>
#include <cstdio>

#include "server/dashboard.h"
#include "server/dashboard_assets.h"
#include "openai/openai_api.h"

namespace pagoda::server {

SeriesPoint series_point(double t, const engine::EngineStats& s) {
  SeriesPoint p;
  p.t = t;
  p.blocks_used = s.blocks_used;
  p.blocks_total = s.blocks_total;
  p.blocks_cached = s.blocks_cached;
  p.running = s.num_running;
  p.waiting = s.num_waiting;
  p.prefix_queries = s.prefix_queries_tokens;
  p.prefix_hits = s.prefix_hits_tokens;
  p.preemptions = s.num_preemptions;
  p.generation_tokens = s.generation_tokens_total;
  p.prompt_tokens = s.prompt_tokens_total;
  return p;
}

std::string series_json(const std::vector<SeriesPoint>& points) {
  std::string out = "[";
  char buf[256];
  for (size_t i = 0; i < points.size(); ++i) {
    const SeriesPoint& p = points[i];
    const int n = std::snprintf(buf, sizeof(buf), "%s[%.3f,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld]",
                                i ? "," : "", p.t, static_cast<long long>(p.blocks_used),
                                static_cast<long long>(p.blocks_total), static_cast<long long>(p.blocks_cached),
                                static_cast<long long>(p.running), static_cast<long long>(p.waiting),
                                static_cast<long long>(p.prefix_queries), static_cast<long long>(p.prefix_hits),
                                static_cast<long long>(p.preemptions), static_cast<long long>(p.generation_tokens),
                                static_cast<long long>(p.prompt_tokens));
    out.append(buf, static_cast<size_t>(n));
  }
  out += "]";
  return out;
}

std::vector<uint8_t> grid_codes(const engine::DashboardSnapshot& s) {
  std::vector<uint8_t> g(s.block_state.size(), kGridFree);
  for (size_t b = 0; b < g.size(); ++b) {
    switch (static_cast<engine::BlockState>(s.block_state[b])) {
      case engine::BlockState::kFree: g[b] = kGridFree; break;
      case engine::BlockState::kCached: g[b] = kGridCached; break;
      case engine::BlockState::kTier: g[b] = kGridTier; break;
      case engine::BlockState::kNull: g[b] = kGridNull; break;
      case engine::BlockState::kOther: g[b] = kGridUsedUnknown; break;  // another tenant's: no owner, no prefix
      case engine::BlockState::kUsed: {
        const int32_t o = b < s.block_owner.size() ? s.block_owner[b] : -1;
        g[b] = static_cast<uint8_t>(o == -2 ? int{kGridShared} : o < 0 ? int{kGridUsedUnknown} : kGridRequest0 + o % 250);
        break;
      }
    }
  }
  return g;
}

std::string base64_encode(const uint8_t* d, size_t n) {
  static const char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < n; i += 3) {
    const uint32_t v = (uint32_t{d[i]} << 16) | (uint32_t{d[i + 1]} << 8) | d[i + 2];
    out += k[v >> 18];
    out += k[(v >> 12) & 63];
    out += k[(v >> 6) & 63];
    out += k[v & 63];
  }
  if (i < n) {
    const uint32_t v = (uint32_t{d[i]} << 16) | (i + 1 < n ? uint32_t{d[i + 1]} << 8 : 0);
    out += k[v >> 18];
    out += k[(v >> 12) & 63];
    out += i + 1 < n ? k[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string snapshot_json(const engine::DashboardSnapshot& s, const std::vector<std::string>& tags, double t) {
  json j;
  j["t"] = t;
  j["block_size"] = s.block_size;
  j["num_blocks"] = s.block_state.size();
  j["num_groups"] = s.num_groups;
  const std::vector<uint8_t> grid = grid_codes(s);
  j["grid"] = base64_encode(grid.data(), grid.size());
  json reqs = json::array();
  for (size_t i = 0; i < s.requests.size(); ++i) {
    const engine::SnapshotRequest& r = s.requests[i];
    reqs.push_back({{"id", r.id},
                    {"tag", i < tags.size() ? tags[i] : std::string()},
                    {"index", r.index},
                    {"state", r.state},
                    {"why", r.why},
                    {"prompt", r.num_prompt_tokens},
                    {"output", r.num_output_tokens},
                    {"computed", r.num_computed_tokens},
                    {"cached", r.num_cached_tokens},
                    {"miss", r.prefix_miss},
                    {"preemptions", r.num_preemptions},
                    {"colour", static_cast<int>(kGridRequest0) + static_cast<int>(i % 250)},
                    {"tables", r.block_tables}});
  }
  j["requests"] = std::move(reqs);
  j["num_running"] = s.num_running;
  j["num_waiting"] = s.num_waiting;
  json nodes = json::array();
  for (const engine::PrefixNode& n : s.prefix_nodes) {
    json node = json::array({n.block, n.parent_block, n.hits, n.depth, n.in_use ? 1 : 0});
    // A pinned block (issue 36) carries a sixth element: its TTL left in seconds.
    if (n.pin_ttl_s > 0) node.push_back(std::round(n.pin_ttl_s * 10.0f) / 10.0f);
    nodes.push_back(std::move(node));
  }
  j["prefix"] = {{"cached_blocks", s.prefix_cached_blocks}, {"nodes", std::move(nodes)}};
  j["counters"] = {{"blocks_total", s.blocks_total},     {"blocks_used", s.blocks_used},
                   {"blocks_cached", s.blocks_cached},   {"blocks_free", s.blocks_free},
                   {"prefix_queries", s.prefix_queries_tokens}, {"prefix_hits", s.prefix_hits_tokens},
                   {"preemptions", s.num_preemptions},   {"generation_tokens", s.generation_tokens_total},
                   {"prompt_tokens", s.prompt_tokens_total}};
  return dump_json(j);
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string query_param(const std::string& query, const std::string& name) {
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t end = query.find('&', pos);
    if (end == std::string::npos) end = query.size();
    const std::string part = query.substr(pos, end - pos);
    const size_t eq = part.find('=');
    if (part.substr(0, eq) == name) {
      const std::string raw = eq == std::string::npos ? std::string() : part.substr(eq + 1);
      std::string out;
      for (size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] == '+') {
          out += ' ';
        } else if (raw[i] == '%' && i + 2 < raw.size() && hex_value(raw[i + 1]) >= 0 && hex_value(raw[i + 2]) >= 0) {
          out += static_cast<char>(hex_value(raw[i + 1]) * 16 + hex_value(raw[i + 2]));
          i += 2;
        } else {
          out += raw[i];
        }
      }
      return out;
    }
    pos = end + 1;
  }
  return "";
}

// Replaces the one occurrence of `marker` in `page` with `text`.
static void fill(std::string* page, const std::string& marker, const std::string& text) {
  const size_t at = page->find(marker);
  if (at != std::string::npos) page->replace(at, marker.size(), text);
}

const std::string& dashboard_page() {
  static const std::string page = [] {
    std::string p = kDashboardHtml;
    fill(&p, "/*@CSS@*/", kDashboardCss);
    fill(&p, "/*@PLOTS_JS@*/", kPlotsJs);
    fill(&p, "/*@APP_JS@*/", kDashboardJs);
    return p;
  }();
  return page;
}

std::string report_html(const std::string& title, const std::vector<SeriesPoint>& points,
                        const std::string& summary_json) {
  std::string p = kReportHtml;
  // Inside <script>: "</" would end the element; JSON allows "<\/".
  auto script_safe = [](std::string s) {
    for (size_t at = s.find("</"); at != std::string::npos; at = s.find("</", at + 3)) s.replace(at, 2, "<\\/");
    return s;
  };
  const json t = title;
  fill(&p, "/*@CSS@*/", kDashboardCss);
  fill(&p, "/*@PLOTS_JS@*/", kPlotsJs);
  fill(&p, "/*@DATA@*/", script_safe("{\"title\":" + dump_json(t) + ",\"series\":" + series_json(points) +
                                     ",\"summary\":" + (summary_json.empty() ? "{}" : summary_json) + "}"));
  return p;
}

}  // namespace pagoda::server
