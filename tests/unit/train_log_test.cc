// Golden log lines (MXNet's exact formats) and the metrics behind them.
#include "worker/train_log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "worker/metrics.h"

namespace pstrain {
namespace {

TEST(TrainLogTest, GoldenLines) {
  EXPECT_EQ(FormatSpeedLine(3, 40, 12345.678, {{"accuracy", 0.953125}}),
            "Epoch[3] Batch [40]\tSpeed: 12345.68 samples/sec\taccuracy=0.953125");
  EXPECT_EQ(FormatSpeedLine(0, 20, 1.0, {{"accuracy", 0.5}, {"top_k_accuracy_5", 0.75}}),
            "Epoch[0] Batch [20]\tSpeed: 1.00 samples/sec\taccuracy=0.500000"
            "\ttop_k_accuracy_5=0.750000");
  // MXNet's Speedometer without an eval metric (--emulate-compute has none).
  EXPECT_EQ(FormatSpeedLine(1, 5, 3200.0, {}), "Iter[1] Batch [5]\tSpeed: 3200.00 samples/sec");
  EXPECT_EQ(FormatEpochMetricLines(3, "Train", {{"accuracy", 0.819261}}),
            std::vector<std::string>{"Epoch[3] Train-accuracy=0.819261"});
  EXPECT_EQ(FormatEpochMetricLines(11, "Validation", {{"accuracy", 0.9921}}),
            std::vector<std::string>{"Epoch[11] Validation-accuracy=0.992100"});
  EXPECT_EQ(FormatTimeCostLine(2, 12.34567), "Epoch[2] Time cost=12.346");
  EXPECT_EQ(FormatSavedCheckpointLine("m-0001.params"), "Saved checkpoint to \"m-0001.params\"");
  EXPECT_EQ(FormatTestIoLine(19, 5000.0), "Batch [19]\tSpeed: 5000.00 samples/sec");
  EXPECT_EQ(FormatEpochStartLine(2, 469, 128, 10),
            "Epoch[2] Start: 469 batches of 128 samples; --num-epochs 10");
}

// Our start-of-epoch line (what the live view's ETA needs) is no result to
// MXNet's parse_log.py: none of its patterns, first (2015) or later, match it.
TEST(TrainLogTest, MxnetParseLogRegexesSkipTheStartOfEpochLine) {
  const std::string line = "INFO:root:" + FormatEpochStartLine(0, 30, 100, 2);
  for (const char* pattern :
       {R"(.*Epoch\[(\d+)\] Train.*=([.\d]+))", R"(.*Epoch\[(\d+)\] Valid.*=([.\d]+))",
        R"(.*Epoch\[(\d+)\] Time.*=([.\d]+))", R"(Epoch\[(\d+)\] Train-accuracy.*=([.\d]+))",
        R"(Epoch\[(\d+)\] Validation-accuracy.*=([.\d]+))"}) {
    EXPECT_FALSE(std::regex_search(line, std::regex(pattern))) << pattern;
  }
}

TEST(TrainLogTest, MxnetParseLogRegexesMatchOurLines) {
  std::vector<std::string> lines;
  TrainLog log([&](const std::string& l) { lines.push_back(l); });
  for (const auto& l : FormatEpochMetricLines(4, "Train", {{"accuracy", 0.9}})) log.Info(l);
  log.Info(FormatTimeCostLine(4, 3.5));
  for (const auto& l : FormatEpochMetricLines(4, "Validation", {{"accuracy", 0.95}})) log.Info(l);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "INFO:root:Epoch[4] Train-accuracy=0.900000");
  // tools/parse_log.py (1.x) patterns.
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(lines[0], m, std::regex(R"(Epoch\[(\d+)\] Train-accuracy.*=([.\d]+))")));
  EXPECT_EQ(m[1], "4");
  EXPECT_EQ(m[2], "0.900000");
  ASSERT_TRUE(std::regex_search(lines[1], m, std::regex(R"(Epoch\[(\d+)\] Time.*=([.\d]+))")));
  EXPECT_EQ(m[2], "3.500");
  ASSERT_TRUE(std::regex_search(lines[2], m,
                                std::regex(R"(Epoch\[(\d+)\] Validation-accuracy.*=([.\d]+))")));
  EXPECT_EQ(m[2], "0.950000");
}

TEST(MetricsTest, AccuracyAndTopKSkipPadding) {
  ClassificationMetrics m(2);
  const float probs[] = {
      0.1f, 0.7f, 0.2f,  // argmax 1
      0.5f, 0.2f, 0.3f,  // argmax 0, second 2
      0.2f, 0.3f, 0.5f,  // argmax 2
      0.9f, 0.0f, 0.1f,  // padding
  };
  const float labels[] = {1, 2, 1, 0};
  m.Update(probs, labels, 3, 3);
  auto v = m.Get();
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].first, "accuracy");
  EXPECT_DOUBLE_EQ(v[0].second, 1.0 / 3);
  EXPECT_EQ(v[1].first, "top_k_accuracy_2");
  EXPECT_DOUBLE_EQ(v[1].second, 3.0 / 3);
  EXPECT_EQ(m.num_examples(), 3);
  m.Reset();
  EXPECT_TRUE(std::isnan(m.Get()[0].second));
  ClassificationMetrics plain;
  plain.Update(probs, labels, 4, 3);
  ASSERT_EQ(plain.Get().size(), 1u);
  EXPECT_DOUBLE_EQ(plain.Get()[0].second, 2.0 / 4);
}

}  // namespace
}  // namespace pstrain
