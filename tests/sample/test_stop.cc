#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sample/stop.h"

using namespace pagoda::sample;

TEST(Stop, ScanFindsEarliestMatchAndHoldsBackPartial) {
  const std::vector<std::string> stops = {"\nUser:", "###", "ab"};
  StopScan s = scan_stop_strings("hello", 0, stops);
  EXPECT_FALSE(s.stopped);
  EXPECT_EQ(s.emit_end, 5u);
  s = scan_stop_strings("hello\nUs", 0, stops);
  EXPECT_FALSE(s.stopped);
  EXPECT_EQ(s.emit_end, 5u);  // "\nUs" held back
  s = scan_stop_strings("x##", 1, stops);
  EXPECT_EQ(s.emit_end, 1u);
  s = scan_stop_strings("x ### y ab", 0, stops);
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.emit_end, 2u);  // earliest match wins
  s = scan_stop_strings("zz ab ###", 0, stops);
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.emit_end, 3u);
  s = scan_stop_strings("a", 0, std::vector<std::string>{});
  EXPECT_EQ(s.emit_end, 1u);
}

TEST(Stop, FilterStreamsWithoutLeakingAStopString) {
  StopStringFilter f(std::vector<std::string>{"\nUser:"});
  std::string out;
  out += f.push("Hello");
  EXPECT_EQ(out, "Hello");
  out += f.push(" world\nUs");
  EXPECT_EQ(out, "Hello world");
  out += f.push("e");
  EXPECT_EQ(out, "Hello world");
  out += f.push("r: more");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(out, "Hello world");
  EXPECT_EQ(f.push("x"), "");
  EXPECT_EQ(f.flush(), "");
  EXPECT_EQ(f.emitted_text(), "Hello world");
}

TEST(Stop, FilterReleasesAFalseAlarmAndFlushesTail) {
  StopStringFilter f(std::vector<std::string>{"###"});
  EXPECT_EQ(f.push("a#"), "a");
  EXPECT_EQ(f.push("#"), "");
  EXPECT_EQ(f.push("b"), "##b");
  EXPECT_EQ(f.push("c#"), "c");
  EXPECT_EQ(f.flush(), "#");
  EXPECT_FALSE(f.stopped());
  EXPECT_EQ(f.emitted_text(), "a##bc#");
}

TEST(Stop, StopStringsAreSharedNotCopied) {
  const std::vector<std::string> list(16, std::string(1024, 'x'));
  const StopStrings stops = list;
  ASSERT_EQ(stops.size(), 16u);
  EXPECT_NE(stops.list().data(), list.data());  // built once from the vector ...
  EXPECT_EQ(stops.use_count(), 1);
  SamplingParams a, b;
  a.stop = stops;
  b = a;  // ... then every copy points at it
  StopStringFilter f0(a.stop), f1(b.stop);
  EXPECT_EQ(f0.stops().get(), stops.get());
  EXPECT_EQ(f1.stops().get(), stops.get());
  EXPECT_EQ(b.stop.get(), stops.get());
  EXPECT_EQ(stops.use_count(), 5);  // stops, a, b, f0, f1
  // No stop strings: no list at all.
  const StopStrings none = std::vector<std::string>{};
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.get(), nullptr);
  EXPECT_TRUE(none.view().empty());
  const StopStrings braced = {"a", "bc"};
  EXPECT_EQ(braced.list(), (std::vector<std::string>{"a", "bc"}));
  // A shared list cuts text exactly as before.
  StopStringFilter g(braced), h(braced);
  EXPECT_EQ(g.push("xxb"), "xx");
  EXPECT_EQ(g.push("c!"), "");  // "b" + "c" completes "bc": the held "b" is never shown
  EXPECT_TRUE(g.stopped());
  EXPECT_EQ(g.emitted_text(), "xx");
  EXPECT_EQ(h.push("zz"), "zz");
  EXPECT_FALSE(h.stopped());
}
