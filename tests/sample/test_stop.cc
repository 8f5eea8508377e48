#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sample/stop.h"

using namespace pagoda::sample;

TEST(Stop, TokenConditions) {
  SamplingParams p;
  p.max_tokens = 3;
  p.stop_token_ids = {7};
  const std::vector<int32_t> eog = {2, 5};
  EXPECT_EQ(check_token(p, 9, 1, eog), FinishReason::kNone);
  EXPECT_EQ(check_token(p, 2, 1, eog), FinishReason::kStop);
  EXPECT_EQ(check_token(p, 5, 2, eog), FinishReason::kStop);
  EXPECT_EQ(check_token(p, 7, 1, eog), FinishReason::kStop);
  EXPECT_EQ(check_token(p, 9, 3, eog), FinishReason::kLength);
  p.ignore_eos = true;
  EXPECT_EQ(check_token(p, 2, 1, eog), FinishReason::kNone);
  EXPECT_EQ(check_token(p, 7, 1, eog), FinishReason::kStop);
  p.max_tokens = 0;  // unlimited
  EXPECT_EQ(check_token(p, 9, 100000, eog), FinishReason::kNone);
  EXPECT_STREQ(finish_reason_name(FinishReason::kLength), "length");
  EXPECT_STREQ(finish_reason_name(FinishReason::kStop), "stop");
}

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
