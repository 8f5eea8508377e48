// pagoda template --model M | --template FILE --messages FILE.json [--tools FILE.json]
//                 [--no-generation-prompt] [--bos TEXT] [--eos TEXT] [--now EPOCH] [--spans]
// Prints the chat prompt a template renders for a conversation (exactly the text
// run/serve tokenize), or with --spans a JSON object {"text", "content_spans"}.
// --check-prefix-stability [--json]: whether each turn's prompt extends the
// previous turn's rendering (tok/prefix_stability.h); exit 3 when one does not.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "gguf/gguf.h"
#include "tok/chat_template.h"
#include "tok/prefix_stability.h"
#include "tok/tokenizer.h"

namespace pagoda::cli {
namespace {

constexpr const char* kUsage =
    "usage: pagoda template (--model M.gguf | --template FILE) --messages FILE.json\n"
    "                       [--tools FILE.json] [--no-generation-prompt]\n"
    "                       [--bos TEXT] [--eos TEXT] [--now EPOCH] [--spans]\n"
    "       pagoda template --check-prefix-stability (--model M.gguf | --template FILE)\n"
    "                       --messages FILE.json [--json] [...]\n"
    "Renders the chat template (the model's tokenizer.chat_template, or FILE) for the\n"
    "messages (a JSON array of {role, content, ...}) and prints the prompt.\n"
    "  --bos/--eos   token texts for a --template (default: the model's, else none)\n"
    "  --now EPOCH   the time strftime_now formats (UTC seconds; default: now)\n"
    "  --spans       print JSON with the byte spans that came from the messages\n"
    "  --check-prefix-stability\n"
    "                renders each turn (the messages before the N-th assistant message\n"
    "                with the generation prompt, and through it without) and reports\n"
    "                where turn N+1's prompt stops extending turn N's rendering: the\n"
    "                byte, the token (with --model; with both, --template renders and\n"
    "                the model tokenizes) and the text around it. Exit 0: every turn\n"
    "                extends the last; 3: one does not (a prefix cache misses there);\n"
    "                1: an error. --json prints the report as JSON.\n";

int fail(const std::string& msg) {
  std::fprintf(stderr, "pagoda template: %s\n", msg.c_str());
  return 1;
}


Expected<nlohmann::ordered_json> read_json(const std::string& path) {
  std::string text;
  if (!read_file(path, &text)) return errorf("cannot read %s", path.c_str());
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return errorf("%s is not valid JSON", path.c_str());
  return j;
}

// --check-prefix-stability: prints the report; 0 stable, 3 not, 1 error.
int check_stability(const tok::ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                    const tok::ChatRenderOptions& opts, const tok::Tokenizer* tokenizer, bool as_json) {
  auto rep = tok::check_prefix_stability(tmpl, messages, opts, tokenizer);
  if (!rep.ok()) return fail(rep.message());
  if (as_json) {
    nlohmann::json j{{"turns", rep->num_turns}, {"stable", rep->stable()}, {"breaks", nlohmann::json::array()}};
    for (const auto& b : rep->breaks) {
      j["breaks"].push_back({{"turn", b.turn}, {"next_turn", b.turn + 1}, {"byte", b.byte},
                             {"token", b.token < 0 ? nlohmann::json() : nlohmann::json(b.token)},
                             {"context", b.context}, {"prev", b.prev}, {"next", b.next}});
    }
    std::puts(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    auto q = [](const std::string& s) { return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
    for (const auto& b : rep->breaks) {
      std::printf("turn %d's prompt stops extending turn %d's rendering at byte %lld", b.turn + 1, b.turn,
                  static_cast<long long>(b.byte));
      if (b.token >= 0) std::printf(", token %lld", static_cast<long long>(b.token));
      std::printf("\n  before: ...%s\n  turn %d: %s...\n  turn %d: %s...\n", q(b.context).c_str(), b.turn,
                  q(b.prev).c_str(), b.turn + 1, q(b.next).c_str());
    }
    std::printf("%d turns: %s\n", rep->num_turns,
                rep->stable() ? "every prompt extends the previous turn (prefix-cache stable)"
                              : "prefix-cache unstable: later turns re-prefill from the first break");
  }
  return rep->stable() ? 0 : 3;
}

int run_template(int argc, char** argv) {
  std::string model, tmpl_path, messages_path, tools_path, bos, eos;
  bool have_bos = false, have_eos = false, gen = true, spans = false, check = false, as_json = false;
  long long now = 0;
  Args args(argc, argv);  // the one parser of every subcommand (cli/engine_flags.h)
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::string v;
  args.value("--model", &model, "-m");
  args.value("--template", &tmpl_path);
  args.value("--messages", &messages_path);
  args.value("--tools", &tools_path);
  have_bos = args.value("--bos", &bos);
  have_eos = args.value("--eos", &eos);
  if (args.value("--now", &v)) {
    char* end = nullptr;
    now = std::strtoll(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || now <= 0) return fail("--now: bad value '" + v + "'");
  }
  if (args.flag("--no-generation-prompt")) gen = false;
  spans = args.flag("--spans");
  check = args.flag("--check-prefix-stability");
  as_json = args.flag("--json");
  // A usage error, exit 2 as in every subcommand.
  if (std::string err = args.leftover(); !err.empty()) return *help_or_usage_error("template", false, err, kUsage);
  if (messages_path.empty()) {
    std::fputs(kUsage, stderr);
    return fail("--messages is required");
  }
  if (model.empty() && tmpl_path.empty()) model = default_model_path();

  std::string source;
  std::unique_ptr<gguf::GgufFile> gguf_file;  // kept open while the tokenizer lives
  std::unique_ptr<tok::Tokenizer> tokenizer;  // --model: positions in tokens too
  if (!model.empty()) {
    auto file = gguf::GgufFile::open(model);
    if (!file.ok()) return fail(file.message());
    gguf_file = std::move(file).value();
    auto tk = tok::Tokenizer::from_gguf(*gguf_file);
    if (!tk.ok()) return fail(tk.message());
    tokenizer = std::move(tk).value();
    const tok::Tokenizer& t = *tokenizer;
    if (!have_bos && t.bos_id() != tok::kNoToken) bos = t.token_text(t.bos_id());
    if (!have_eos && t.eos_id() != tok::kNoToken) eos = t.token_text(t.eos_id());
    source = t.chat_template();
  }
  if (!tmpl_path.empty() && !read_file(tmpl_path, &source)) return fail("cannot read " + tmpl_path);
  if (source.empty()) return fail(model + " has no tokenizer.chat_template; pass one with --template FILE");

  auto tmpl = tok::ChatTemplate::parse(source, bos, eos);
  if (!tmpl.ok()) return fail(tmpl.message());
  auto messages = read_json(messages_path);
  if (!messages.ok()) return fail(messages.message());
  tok::ChatRenderOptions opts;
  opts.add_generation_prompt = gen;
  opts.now = static_cast<std::time_t>(now);
  if (!tools_path.empty()) {
    auto tools = read_json(tools_path);
    if (!tools.ok()) return fail(tools.message());
    opts.tools = std::move(tools).value();
  }
  if (check) return check_stability(*tmpl, *messages, opts, tokenizer.get(), as_json);
  auto out = tmpl->render_json(*messages, opts);
  if (!out.ok()) return fail(out.message());
  if (spans) {
    nlohmann::json j;
    j["text"] = out->text;
    j["content_spans"] = nlohmann::json::array();
    for (const auto& s : out->content_spans) j["content_spans"].push_back({s.begin, s.end});
    std::fputs(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str(), stdout);
    std::fputc('\n', stdout);
  } else {
    std::fwrite(out->text.data(), 1, out->text.size(), stdout);
  }
  return 0;
}

const Register kRegisterTemplate("template", "render a chat template for a conversation (JSON messages)",
                                 run_template);

}  // namespace
}  // namespace pagoda::cli
