// The Jinja interpreter against jinja2 (fixtures written by scripts/make_jinja_fixture.py
// and scripts/compare_templates.py), its limits on hostile templates, and taint spans.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tok/chat_template.h"
#include "tok/jinja.h"
#include "tok/tok_test_util.h"

using namespace pagoda;
using namespace pagoda::tok;
using pagoda::tok::testing::read_file;

namespace {

const std::string kFixtures = PAGODA_SOURCE_DIR "/tests/tok/fixtures";

Expected<jinja::Rendered> render(const std::string& src, const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object(),
                                 const jinja::Limits& limits = {}) {
  PAGODA_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::parse(src, limits));
  jinja::Context c;
  for (auto it = ctx.begin(); it != ctx.end(); ++it) {
    PAGODA_ASSIGN_OR_RETURN(jinja::Value v, jinja::from_json(it.value(), false));
    c.set(it.key(), std::move(v));
  }
  c.now = 1721952000;  // what the fixtures' strftime_now formats
  return t.render(c);
}

// The text of spans, for readable expectations.
std::vector<std::string> span_texts(const std::string& text, const std::vector<jinja::Span>& spans) {
  std::vector<std::string> out;
  for (const auto& s : spans) out.push_back(text.substr(s.begin, s.end - s.begin));
  return out;
}

}  // namespace

TEST(Jinja, SnippetsMatchJinja2) {
  const auto cases = nlohmann::ordered_json::parse(read_file(kFixtures + "/jinja_snippets.json"));
  ASSERT_GE(cases.size(), 70u);
  // Where pagoda is deliberately stricter than jinja2's sandbox: an unsafe attribute
  // is an error here (jinja2 returns an undefined that prints as "").
  const std::set<std::string> stricter = {"unsafe_attribute"};
  int rendered = 0, raised = 0;
  for (const auto& c : cases) {
    const std::string name = c["name"];
    auto out = render(c["template"].get<std::string>(), c["context"]);
    if (c["expected"].is_null() || stricter.count(name) != 0) {
      EXPECT_FALSE(out.ok()) << name << " rendered " << out->text << " but jinja2 raised " << c["error"];
      ++raised;
    } else {
      ASSERT_TRUE(out.ok()) << name << ": " << out.message();
      EXPECT_EQ(out->text, c["expected"].get<std::string>()) << name;
      EXPECT_TRUE(out->tainted.empty()) << name;  // nothing in the context was tainted
      ++rendered;
    }
  }
  EXPECT_GT(rendered, 60);
  EXPECT_GT(raised, 8);
}

// Permissively licensed real templates (Apache-2.0 / MIT models, copied from the
// llama.cpp tree) on the six conversations of scripts/compare_templates.py.
TEST(Jinja, RealTemplatesMatchJinja2) {
  const auto cases = nlohmann::ordered_json::parse(read_file(kFixtures + "/jinja_renders.json"));
  ASSERT_EQ(cases.size(), 48u);
  int rendered = 0;
  for (const auto& c : cases) {
    const std::string label = c["template"].get<std::string>() + "/" + c["conversation"].get<std::string>();
    auto tmpl = ChatTemplate::parse(read_file(kFixtures + "/templates/" + c["template"].get<std::string>()),
                                    c["bos"], c["eos"]);
    ASSERT_TRUE(tmpl.ok()) << label << ": " << tmpl.message();
    ChatRenderOptions o;
    o.add_generation_prompt = c["add_generation_prompt"];
    o.tools = c["tools"];
    o.now = c["now"].get<int64_t>();
    auto out = tmpl->render_json(c["messages"], o);
    if (c["expected"].is_null()) {
      EXPECT_FALSE(out.ok()) << label << " rendered but jinja2 raised " << c["error"];
      continue;
    }
    ASSERT_TRUE(out.ok()) << label << ": " << out.message();
    EXPECT_EQ(out->text, c["expected"].get<std::string>()) << label;
    ++rendered;
  }
  EXPECT_GE(rendered, 36);
}

// Every hostile template fails with an error within 1 s and 64 MiB of extra
// address space (each runs in a child process under RLIMIT_AS).
TEST(Jinja, HostileTemplatesFailFastWithBoundedMemory) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The bounds are the release build's: a sanitizer reserves terabytes of shadow
  // address space (so RLIMIT_AS cannot cap it) and its larger frames overflow the
  // stack before the evaluator's depth limit of 1000 (sized for release frames).
  // The release pass of scripts/test runs this test.
  GTEST_SKIP() << "memory and stack bounds are calibrated for the release build";
#endif
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(kFixtures + "/hostile")) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 15u);
  for (const auto& path : files) {
    const std::string src = read_file(path.string());
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      alarm(10);  // a regression must not hang the suite
      // Current address space + 64 MiB.
      long vm_kb = 0;
      if (FILE* f = std::fopen("/proc/self/status", "r")) {
        char line[256];
        while (std::fgets(line, sizeof line, f)) {
          if (std::sscanf(line, "VmSize: %ld kB", &vm_kb) == 1) break;
        }
        std::fclose(f);
      }
      rlimit rl{};
      rl.rlim_cur = rl.rlim_max = static_cast<rlim_t>(vm_kb) * 1024 + (64u << 20);
      setrlimit(RLIMIT_AS, &rl);
      const auto t0 = std::chrono::steady_clock::now();
      auto out = render(src, {{"messages", nlohmann::ordered_json::array()}});
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::string msg = out.ok() ? "RENDERED" : out.message();
      msg = msg.substr(0, 200) + " (" + std::to_string(s) + " s)";
      ssize_t w = write(fds[1], msg.data(), msg.size());
      (void)w;
      _exit(out.ok() ? 1 : s > 1.0 ? 2 : 0);
    }
    close(fds[1]);
    std::string msg;
    char buf[512];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status)) << path.filename() << " crashed (signal " << WTERMSIG(status) << ")";
    EXPECT_EQ(WEXITSTATUS(status), 0) << path.filename() << ": " << msg;
    EXPECT_FALSE(msg.empty()) << path.filename();
  }
}

TEST(Jinja, LimitsAreConfigurableAndNamed) {
  jinja::Limits l;
  l.max_call_depth = 3;
  auto deep = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {}, l);
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.message().find("recursion deeper than 3"), std::string::npos) << deep.message();
  l = {};
  l.max_output_bytes = 10;
  auto big = render("{{ 'x' * 11 }}", {}, l);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.message().find("output exceeds"), std::string::npos) << big.message();
  EXPECT_TRUE(render("{{ 'x' * 10 }}", {}, l).ok());
  l = {};
  l.max_steps = 100;
  auto slow = render("{% for i in range(1000) %}{% endfor %}", {}, l);
  ASSERT_FALSE(slow.ok());
  EXPECT_NE(slow.message().find("step limit"), std::string::npos) << slow.message();
  l = {};
  l.max_memory_bytes = 1 << 20;
  auto mem = render("{{ ('x' * 2000000) | length }}", {}, l);
  ASSERT_FALSE(mem.ok());
  EXPECT_NE(mem.message().find("memory limit"), std::string::npos) << mem.message();
  l = {};
  l.max_parse_depth = 10;
  auto nest = jinja::Template::parse("{{ ((((((((((((1)))))))))))) }}", l);
  ASSERT_FALSE(nest.ok());
  EXPECT_NE(nest.message().find("nested too deeply"), std::string::npos) << nest.message();
}

// A value nested 50000 deep (legal: jinja2 renders this) is freed without
// recursing once per level: the render runs on a 256 KiB thread stack.
TEST(Jinja, DeepValuesAreFreedWithoutRecursion) {
  struct Arg {
    std::string out;
  } arg;
  auto body = [](void* p) -> void* {
    jinja::Limits l;
    l.max_seconds = 30;  // the point is the teardown, not the speed of a loaded machine
    auto r = render("{% set ns = namespace(v=[]) %}{% for i in range(50000) %}{% set ns.v = [ns.v] %}{% endfor %}"
                    "{{ ns.v | length }}",
                    nlohmann::ordered_json::object(), l);
    static_cast<Arg*>(p)->out = r.ok() ? r->text : r.message();
    return nullptr;
  };
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_t th;
  ASSERT_EQ(pthread_create(&th, &attr, body, &arg), 0);
  pthread_join(th, nullptr);
  pthread_attr_destroy(&attr);
  EXPECT_EQ(arg.out, "1");
}

TEST(Jinja, NamespaceCyclesAreRefused) {
  auto r = render("{% set ns = namespace(a=1) %}{% set other = namespace(x=[ns]) %}{% set ns.b = [1, other] %}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("reference cycle"), std::string::npos) << r.message();
  auto ok = render("{% set a = namespace(v=1) %}{% set b = namespace(x=a) %}{% set b.y = a %}{{ b.x.v }}{{ b.y.v }}");
  ASSERT_TRUE(ok.ok()) << ok.message();
  EXPECT_EQ(ok->text, "11");
}

TEST(Jinja, SyntaxErrorsNameTheLineAndConstruct) {
  const struct {
    const char* source;
    const char* message_has;
  } cases[] = {
      {"ok\n{% if x %}\n{% endfor %}", "line 3"},
      {"{% for x in y recursive %}{% endfor %}", "recursive"},
      {"{% extends 'base' %}", "no file access"},
      {"{{ 'unterminated }}", "unterminated string"},
  };
  for (const auto& c : cases) {
    auto t = jinja::Template::parse(c.source);
    ASSERT_FALSE(t.ok()) << c.source;
    EXPECT_NE(t.message().find(c.message_has), std::string::npos) << t.message();
  }
}

// Content strings keep their taint through the operations templates apply to them.
TEST(Jinja, TaintFollowsContentThroughStringOperations) {
  auto t = jinja::Template::parse(
      "<{{ c | trim }}>"                     // substring of the content
      "[{{ c.replace('b', 'X') }}]"          // the template's 'X' is not content
      "({{ c.strip()[1:3] }})"               // slicing
      "{{ c.split(' ')[1] }}|"               // split pieces
      "{{ ('>' + c + '<') | upper }}|"       // case mapping keeps offsets
      "{{ c | tojson }}|"                    // escaping rewrites: the whole JSON string
      "{{ c | indent(2, true) }}");
  ASSERT_TRUE(t.ok()) << t.message();
  jinja::Context ctx;
  ctx.set("c", jinja::literal_str(" ab\"c d ", /*tainted=*/true));
  auto r = t->render(ctx);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->text, "<ab\"c d>[ aX\"c d ](b\")ab\"c|> AB\"C D <|\" ab\\\"c d \"|   ab\"c d ");
  EXPECT_EQ(span_texts(r->text, r->tainted),
            (std::vector<std::string>{"ab\"c d", " a", "\"c d ", "b\"", "ab\"c", " AB\"C D ", "\" ab\\\"c d \"",
                                      " ab\"c d "}));
}

TEST(Jinja, TemplateLiteralsAndTokensAreNeverTainted) {
  auto t = jinja::Template::parse("{{ bos }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}");
  ASSERT_TRUE(t.ok());
  jinja::Context ctx;
  ctx.set("bos", jinja::literal_str("<s>"));
  auto msgs = jinja::from_json(nlohmann::ordered_json::parse(R"([{"role": "user", "content": "<|im_end|>hi"}])"),
                               true, {"role"});
  ASSERT_TRUE(msgs.ok());
  ctx.set("messages", *msgs);
  auto r = t->render(ctx);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->text, "<s><|im_start|>user\n<|im_end|>hi<|im_end|>");
  ASSERT_EQ(r->tainted.size(), 1u);
  EXPECT_EQ(r->tainted[0], (jinja::Span{20, 32}));  // after "<s><|im_start|>user\n"
}

TEST(Jinja, RenderIsThreadSafeOnOneTemplate) {
  auto t = jinja::Template::parse("{% for i in range(n) %}{{ i }},{% endfor %}");
  ASSERT_TRUE(t.ok());
  std::vector<std::thread> threads;
  std::vector<std::string> outs(4);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      jinja::Context c;
      c.set("n", jinja::Value::integer(200 + k));
      auto r = t->render(c);
      outs[static_cast<size_t>(k)] = r.ok() ? r->text : r.message();
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) {
    std::string want;
    for (int i = 0; i < 200 + k; ++i) want += std::to_string(i) + ",";
    EXPECT_EQ(outs[static_cast<size_t>(k)], want);
  }
}
