// The serving benchmark's side of the OpenAI HTTP protocol, without a socket:
// server-sent events, streamed completion chunks, the request body, server URLs,
// Prometheus text and GET /v1/models (declared in loadgen/http_client.h).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>

#include "loadgen/http_client.h"

namespace pagoda::loadgen {

using json = nlohmann::json;

// ---- SSE ---------------------------------------------------------------------

void SseParser::feed(std::string_view bytes, const OnData& on_data) {
  for (char c : bytes) {
    if (c == '\n' && last_cr_) {  // second half of CRLF
      last_cr_ = false;
      continue;
    }
    last_cr_ = c == '\r';
    if (c == '\r' || c == '\n') {
      end_line(on_data);
    } else {
      line_ += c;
    }
  }
}

void SseParser::end_line(const OnData& on_data) {
  if (line_.empty()) {  // blank line: dispatch the event
    if (has_data_) on_data(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line_[0] != ':') {  // ':' starts a comment
    const size_t colon = line_.find(':');
    const std::string_view field = std::string_view(line_).substr(0, colon);
    std::string_view value;
    if (colon != std::string::npos) {
      value = std::string_view(line_).substr(colon + 1);
      if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
    }
    if (field == "data") {
      if (has_data_) data_ += '\n';
      data_.append(value);
      has_data_ = true;
    }
  }
  line_.clear();
}

void SseParser::finish(const OnData& on_data) {
  if (!line_.empty()) end_line(on_data);
  if (has_data_) on_data(data_);
  data_.clear();
  has_data_ = false;
  last_cr_ = false;
}

// ---- Chunks and bodies -------------------------------------------------------

namespace {

int64_t int_field(const json& obj, const char* name) {
  if (!obj.is_object()) return -1;
  auto it = obj.find(name);
  return it != obj.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
}

void read_ids(const json& a, std::vector<int32_t>* out) {
  if (!a.is_array()) return;
  for (const json& t : a)
    if (t.is_number_integer()) out->push_back(static_cast<int32_t>(t.get<int64_t>()));
}

}  // namespace

StreamChunk parse_stream_chunk(const std::string& data) {
  StreamChunk c;
  const size_t b = data.find_first_not_of(" \t\r\n");
  const size_t e = data.find_last_not_of(" \t\r\n");
  if (b != std::string::npos && data.compare(b, e - b + 1, "[DONE]") == 0) {
    c.done = true;
    return c;
  }
  json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    c.error = true;
    c.error_message = "stream chunk is not a JSON object: " + data.substr(0, 200);
    return c;
  }
  if (auto it = j.find("error"); it != j.end() && !it->is_null()) {
    c.error = true;
    if (it->is_object() && it->contains("message") && (*it)["message"].is_string())
      c.error_message = (*it)["message"].get<std::string>();
    else
      c.error_message = it->dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 200);
    return c;
  }
  if (auto it = j.find("choices"); it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_object()) {
    const json& ch = (*it)[0];
    c.has_choice = true;
    if (auto t = ch.find("text"); t != ch.end() && t->is_string()) c.text = t->get<std::string>();
    if (auto d = ch.find("delta"); d != ch.end() && d->is_object())
      if (auto t = d->find("content"); t != d->end() && t->is_string()) c.text = t->get<std::string>();
    if (auto t = ch.find("token_ids"); t != ch.end()) read_ids(*t, &c.token_ids);
    if (auto f = ch.find("finish_reason"); f != ch.end() && !f->is_null()) c.finished = true;
  }
  if (c.token_ids.empty())
    if (auto t = j.find("tokens"); t != j.end()) read_ids(*t, &c.token_ids);
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    c.prompt_tokens = int_field(*u, "prompt_tokens");
    c.completion_tokens = int_field(*u, "completion_tokens");
    if (auto d = u->find("prompt_tokens_details"); d != u->end()) c.cached_tokens = int_field(*d, "cached_tokens");
  }
  if (auto t = j.find("timings"); t != j.end() && t->is_object()) {  // llama-server
    if (c.cached_tokens < 0) c.cached_tokens = int_field(*t, "cache_n");
    if (c.completion_tokens < 0) c.completion_tokens = int_field(*t, "predicted_n");
  }
  return c;
}

std::string completion_body(const BenchRequest& r, const std::string& model, bool ignore_eos, bool chat) {
  json j = {{"temperature", 0},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}},
            {"ignore_eos", ignore_eos},
            {"return_token_ids", true}};
  if (chat) {
    j["messages"] = json::array({json{{"role", "user"}, {"content", r.text}}});
    j["max_completion_tokens"] = r.max_tokens;
  } else {
    j["prompt"] = r.prompt;
    j["max_tokens"] = r.max_tokens;
  }
  if (!model.empty()) j["model"] = model;
  // Decoded random ids may split a UTF-8 character: replace, never throw.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Expected<ServerUrl> parse_server_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    return errorf("--server %s: only http://host[:port][/path] URLs are supported", url.c_str());
  std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  ServerUrl u;
  u.base_path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!u.base_path.empty() && u.base_path.back() == '/') u.base_path.pop_back();
  if (u.base_path.size() >= 3 && u.base_path.compare(u.base_path.size() - 3, 3, "/v1") == 0)
    u.base_path.resize(u.base_path.size() - 3);
  u.port = "80";
  if (!authority.empty() && authority[0] == '[') {  // [ipv6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) return errorf("--server %s: unterminated [IPv6] address", url.c_str());
    u.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size() && authority[close + 1] == ':') u.port = authority.substr(close + 2);
  } else {
    const size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) u.port = authority.substr(colon + 1);
  }
  if (u.host.empty()) return errorf("--server %s: no host", url.c_str());
  const long port = std::strtol(u.port.c_str(), nullptr, 10);
  if (u.port.empty() || u.port.find_first_not_of("0123456789") != std::string::npos || port < 1 || port > 65535)
    return errorf("--server %s: bad port '%s'", url.c_str(), u.port.c_str());
  return u;
}

double scrape_metric(const std::string& text, const std::vector<std::string>& suffixes) {
  std::string found;
  double sum = 0;
  bool any = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ \t");
    if (name_end == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, name_end);
    if (found.empty()) {
      for (const std::string& s : suffixes)
        if (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) found = name;
      if (found.empty()) continue;
    } else if (name != found) {
      continue;
    }
    size_t v = name_end;
    if (line[v] == '{') {  // skip labels, honouring quoted values
      bool quoted = false;
      for (++v; v < line.size(); ++v) {
        if (line[v] == '\\' && quoted) { ++v; continue; }
        if (line[v] == '"') quoted = !quoted;
        if (line[v] == '}' && !quoted) break;
      }
      ++v;
    }
    if (v >= line.size()) continue;
    const std::string value(line.substr(v));
    char* end = nullptr;
    const double d = std::strtod(value.c_str(), &end);
    if (end == value.c_str()) continue;
    sum += d;
    any = true;
  }
  return any ? sum : -1;
}

std::string first_model_id(const std::string& models_json) {
  json j = json::parse(models_json, nullptr, false);
  if (!j.is_object()) return "";
  auto d = j.find("data");
  if (d == j.end() || !d->is_array() || d->empty() || !(*d)[0].is_object()) return "";
  auto id = (*d)[0].find("id");
  return id != (*d)[0].end() && id->is_string() ? id->get<std::string>() : "";
}

}  // namespace pagoda::loadgen
