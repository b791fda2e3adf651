// parse-log: the seed 001 tables from MXNet's 2015 logs, our own log lines,
// formats, and the SVG chart.
#include "logtools/log_table.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/env.h"
#include "tests/test_util.h"
#include "tracker/process.h"

namespace pstrain::logtools {
namespace {

std::string MxnetLog(const std::string& name) {
  return pstrain::testing::SharedDataDir() + "/mxnet-logs/" + name;
}

std::string Row(const TableRow& r) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%d %.6f %.6f", r.epoch, r.train.at(0).value_or(-1),
                r.valid.at(0).value_or(-1));
  return buf;
}

struct SeedTable {
  const char* log;
  Op op;
  std::vector<const char*> rows;  // "epoch train valid", as printed in seed 001
};

// Every table of seed 001 (MXNet's example/distributed-training README, 2015).
const SeedTable kSeedTables[] = {
    {"cifar10/incept_2", Op::kAvg, {"10 0.904931 0.867488", "20 0.953142 0.873598"}},
    {"cifar10/incept_3",
     Op::kAvg,
     {"10 0.905315 0.867288", "20 0.954310 0.889022", "30 0.973641 0.898237",
      "40 0.982739 0.899940"}},
    {"cifar10/incept_5",
     Op::kAvg,
     {"10 0.828193 0.804980", "20 0.901002 0.831250", "30 0.938349 0.860444",
      "40 0.953838 0.859629"}},
    {"cifar10/incept_6",
     Op::kAvg,
     {"10 0.799032 0.763262", "20 0.903737 0.847594", "30 0.945143 0.854461",
      "40 0.962789 0.869531"}},
    {"cifar10/incept_7",
     Op::kAvg,
     {"10 0.863264 0.824479", "20 0.923930 0.858333", "30 0.951104 0.862540",
      "40 0.968971 0.873658"}},
    {"cifar10/incept_4",
     Op::kAvg,
     {"10 0.867188 0.837039", "20 0.931913 0.869331", "30 0.959867 0.874098",
      "40 0.975832 0.888101"}},
    {"ilsvrc12/incept_1",
     Op::kAvg,
     {"5 0.532555 0.526332", "10 0.596858 0.568018", "15 0.621247 0.578255",
      "20 0.634014 0.588112"}},
    {"ilsvrc12/incept_6",
     Op::kAvg,
     {"5 0.517945 0.509897", "10 0.579599 0.548764", "15 0.604185 0.570897"}},
    {"ilsvrc12/incept_2",
     Op::kAvg,
     {"5 0.547913 0.535645", "10 0.647100 0.600572", "15 0.693372 0.621829",
      "19 0.717419 0.631606"}},
    {"ilsvrc12/incept_5",
     Op::kAvg,
     {"5 0.548047 0.531654", "10 0.646048 0.589231", "15 0.691162 0.609613",
      "20 0.718662 0.615359"}},
    {"ilsvrc12/incept_4",
     Op::kMax,
     {"5 0.528214 0.502539", "10 0.623501 0.569418", "15 0.660391 0.597289",
      "20 0.714859 0.605626"}},
    {"ilsvrc12/incept_3",
     Op::kMax,
     {"5 0.518088 0.505218", "10 0.602544 0.565539", "15 0.632609 0.584213",
      "20 0.669050 0.595749"}},
    {"ilsvrc12/incept_7", Op::kAvg, {"5 0.516417 0.506337"}},
};

TEST(LogTableTest, ReproducesEverySeedTable) {
  for (const SeedTable& seed : kSeedTables) {
    SCOPED_TRACE(seed.log);
    auto log = ReadLog(MxnetLog(seed.log), {"accuracy"});
    ASSERT_OK(log.status());
    std::vector<TableRow> rows = Summarize(*log, seed.op);
    for (const char* want : seed.rows) {
      int epoch = std::atoi(want);
      auto it = std::find_if(rows.begin(), rows.end(),
                             [epoch](const TableRow& r) { return r.epoch == epoch; });
      ASSERT_NE(it, rows.end()) << "no epoch " << epoch;
      EXPECT_EQ(Row(*it), want);
    }
  }
}

TEST(LogTableTest, MarkdownMatchesParseLogPy) {
  auto log = ReadLog(MxnetLog("ilsvrc12/incept_2"), {"accuracy"});
  ASSERT_OK(log.status());
  std::string table = FormatTable(Summarize(*log, Op::kAvg), {"accuracy"}, TableFormat::kMarkdown);
  const std::string head =
      "| epoch | train-accuracy | valid-accuracy | time |\n"
      "| --- | --- | --- | --- |\n"
      "|  1 | ";
  EXPECT_EQ(table.substr(0, head.size()), head);
  // The seed's only table with times: epochs 5, 10, 15, 19, averaged over 5 workers.
  for (const char* row :
       {"|  5 | 0.547913 | 0.535645 | 3013.3 |\n", "| 10 | 0.647100 | 0.600572 | 3040.4 |\n",
        "| 15 | 0.693372 | 0.621829 | 3039.6 |\n", "| 19 | 0.717419 | 0.631606 | 3042.3 |\n"}) {
    EXPECT_NE(table.find(row), std::string::npos) << row << " in\n" << table;
  }
}

TEST(LogTableTest, OurLinesWithPrefixesBatchLinesAndSeveralMetrics) {
  LogAccumulator acc("ours", {"accuracy", "top_k_accuracy_5"});
  acc.AddText(
      "[worker-0] 2026-11-22 01:02:03,456 Node[0] Epoch[0] Batch [20]\tSpeed: 812.50 "
      "samples/sec\taccuracy=0.100000\ttop_k_accuracy_5=0.300000\n"
      "[worker-0] 2026-11-22 01:02:04,000 Node[0] Epoch[0] Train-accuracy=0.400000\n"
      "[worker-1] INFO:root:Epoch[0] Train-accuracy=0.600000\r\n"
      "[worker-0] Epoch[0] Train-top_k_accuracy_5=0.900000\n"
      "[worker-0] Epoch[0] Time cost=10.000\n"
      "[worker-1] Epoch[0] Time cost=12.000\n"
      "[worker-0] Epoch[0] Validation-accuracy=0.350000\n"
      "Epoch[1] Train-accuracy=0.7\n"
      "Epoch[x] Train-accuracy=0.9\n"
      "Epoch[2] Train-cross-entropy=1.5\n"
      "garbage Epoch[3 Train-accuracy=1\n");
  const ParsedLog& log = acc.log();
  EXPECT_EQ(log.lines_matched, 7);
  std::vector<TableRow> rows = Summarize(log, Op::kAvg);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(FormatTable(rows, log.metrics, TableFormat::kMarkdown),
            "| epoch | train-accuracy | train-top_k_accuracy_5 | valid-accuracy | "
            "valid-top_k_accuracy_5 | time |\n"
            "| --- | --- | --- | --- | --- | --- |\n"
            "|  1 | 0.500000 | 0.900000 | 0.350000 | - | 11.0 |\n"
            "|  2 | 0.700000 | - | - | - | - |\n");
  EXPECT_EQ(
      FormatTable(Summarize(log, Op::kMax), {"accuracy", "top_k_accuracy_5"}, TableFormat::kTsv),
      "epoch\ttrain-accuracy\ttrain-top_k_accuracy_5\tvalid-accuracy\t"
      "valid-top_k_accuracy_5\ttime\n"
      "1\t0.600000\t0.900000\t0.350000\t\t11.0\n"
      "2\t0.700000\t\t\t\t\n");
  EXPECT_EQ(FormatTable(rows, log.metrics, TableFormat::kCsv).substr(0, 20),
            "epoch,train-accuracy");
  EXPECT_EQ(FormatTable(rows, log.metrics, TableFormat::kCsv, Header::kMxnet1x).substr(0, 65),
            "epoch,train-accuracy,train-top_k_accuracy_5,val-accuracy,val-top_");
  // parse_log.py's `none`: tabs, the epoch as "%2d".
  auto none = ParseTableFormat("none");
  ASSERT_OK(none.status());
  EXPECT_EQ(FormatTable(Summarize(log, Op::kMax), {"accuracy", "top_k_accuracy_5"}, *none),
            "epoch\ttrain-accuracy\ttrain-top_k_accuracy_5\tvalid-accuracy\t"
            "valid-top_k_accuracy_5\ttime\n"
            " 1\t0.600000\t0.900000\t0.350000\t\t11.0\n"
            " 2\t0.700000\t\t\t\t\n");
}

// parse_log.py's `=([.\d]+)` does not match nan or inf: such a line (a
// worker without validation examples logs accuracy=nan) is skipped, and the
// epoch is the others' average, whatever order the lines came in.
TEST(LogTableTest, ANanValueIsSkippedAsParseLogPySkipsIt) {
  for (bool nan_first : {false, true}) {
    const std::string a = "[worker-0] Epoch[0] Validation-accuracy=0.750000\n";
    const std::string b =
        "[worker-1] Epoch[0] Validation-accuracy=nan\n"
        "[worker-1] Epoch[0] Time cost=inf\n";
    LogAccumulator acc("ours", {"accuracy"});
    acc.AddText(
        "[worker-0] Epoch[0] Train-accuracy=0.810000\n[worker-0] Epoch[0] Time cost=10.5\n" +
        (nan_first ? b + a : a + b));
    for (Op op : {Op::kAvg, Op::kMax}) {
      std::vector<TableRow> rows = Summarize(acc.log(), op);
      ASSERT_EQ(rows.size(), 1u);
      EXPECT_EQ(Row(rows[0]), "1 0.810000 0.750000");
      EXPECT_EQ(rows[0].time.value_or(-1), 10.5);
    }
  }
}

TEST(LogTableTest, ErrorsNameThePath) {
  auto missing = ReadLog("/nonexistent/log", {"accuracy"});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/log"), std::string::npos);
  std::string path = ::testing::TempDir() + "/no_epochs.log";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("INFO:root:Start training with [gpu(0), gpu(1)]\nEpoch[1] Batch [2]\tSpeed: 1\n", f);
  std::fclose(f);
  auto none = ReadLog(path, {"accuracy"});
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find(path), std::string::npos);
  // A misspelt metric name: Time cost lines matched, so the table was all
  // dashes and parse-log exited 0 (found by review). Now it names the
  // metrics the log has.
  const std::string timed = ::testing::TempDir() + "/timed.log";
  f = std::fopen(timed.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(
      "INFO:root:Epoch[0] Train-accuracy=0.5\nINFO:root:Epoch[0] Time cost=10.0\n"
      "INFO:root:Epoch[0] Validation-top_k_accuracy_5=0.9\n",
      f);
  std::fclose(f);
  auto typo = ReadLog(timed, {"accuracy", "acc"});
  EXPECT_EQ(typo.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(typo.status().message().find("no epoch results of metric 'acc'"), std::string::npos)
      << typo.status();
  EXPECT_NE(typo.status().message().find("its metrics: accuracy, top_k_accuracy_5"),
            std::string::npos)
      << typo.status();
  EXPECT_OK(ReadLog(timed, {"accuracy", "top_k_accuracy_5"}).status());
  EXPECT_FALSE(ParseOp("median").ok());
  EXPECT_FALSE(ParseTableFormat("html").ok());
}

TEST(LogTableTest, SvgHasOneCurvePerLogAndSplit) {
  std::vector<std::pair<std::string, std::vector<TableRow>>> logs;
  for (const char* name : {"cifar10/incept_3", "cifar10/incept_5"}) {
    auto log = ReadLog(MxnetLog(name), {"accuracy"});
    ASSERT_OK(log.status());
    logs.emplace_back(log->name, Summarize(*log, Op::kAvg));
  }
  logs.emplace_back("a <b> & c", std::vector<TableRow>{logs[0].second[0]});
  std::string svg = PlotSvg(logs, "accuracy", 0);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>\n"), std::string::npos);
  size_t polylines = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1)) {
    ++polylines;
  }
  EXPECT_EQ(polylines, 4u) << "valid and train of the two 40-epoch logs";
  EXPECT_NE(svg.find("<circle"), std::string::npos) << "a one-epoch log is a point";
  EXPECT_NE(svg.find("a &lt;b&gt; &amp; c valid"), std::string::npos);
  EXPECT_NE(svg.find("cifar10/incept_3 valid<"), std::string::npos);
  logs.pop_back();
  EXPECT_NE(PlotSvg(logs, "accuracy", 0).find(">incept_3 valid<"), std::string::npos)
      << "the directory all names share is dropped";
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

// An absolute and a relative path share no directory (the search for one
// used to wrap around and loop for ever), and values too large for a tiny
// step to move the ticks (3e12 everywhere) plot a bounded grid.
TEST(LogTableTest, SvgOfAnyPathsAndValuesEnds) {
  TableRow row;
  row.epoch = 1;
  row.train = {0.5};
  row.valid = {0.4};
  std::vector<std::pair<std::string, std::vector<TableRow>>> logs = {
      {"/work/shared/data/mxnet-logs/cifar10/incept_2", {row}}, {"./logs/job", {row}}};
  std::string svg = PlotSvg(logs, "accuracy", 0);
  EXPECT_NE(svg.find(">cifar10/incept_2 valid<"), std::string::npos) << "shortened to 24";
  EXPECT_NE(svg.find(">./logs/job valid<"), std::string::npos);
  logs = {{"/a/b/x.log", {row}}, {"/a/c/y.log", {row}}};
  svg = PlotSvg(logs, "accuracy", 0);
  EXPECT_NE(svg.find(">b/x.log valid<"), std::string::npos) << "/a/ is shared";

  row.train = {3000000000000.5};
  row.valid = {3000000000000.5};
  svg = PlotSvg({{"big", {row}}}, "mse", 0);
  size_t lines = 0;
  for (size_t p = svg.find("<line"); p != std::string::npos; p = svg.find("<line", p + 1)) ++lines;
  EXPECT_LT(lines, 40u);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

TEST(LogTableTest, CommandLine) {
  std::string out;
  int status = 0;
  ASSERT_OK(
      tracker::RunAndCapture({pstrain::testing::PstrainBinary(), "parse-log",
                              MxnetLog("ilsvrc12/incept_4"), "--op", "max", "--format", "csv"},
                             Environment().All(), 30000, &out, &status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_EQ(out.substr(0, 37), "epoch,train-accuracy,valid-accuracy,t");
  EXPECT_NE(out.find("\n20,0.714859,0.605626,"), std::string::npos) << out;
  // --metric-names is MXNet 1.x's parse_log.py's option, and takes its names:
  // "val-<m>" (the 2015 script, with no such option, says "valid-<m>").
  ASSERT_OK(tracker::RunAndCapture({pstrain::testing::PstrainBinary(), "parse-log",
                                    MxnetLog("ilsvrc12/incept_4"), "--metric-names", "accuracy"},
                                   Environment().All(), 30000, &out, &status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_EQ(out.substr(0, out.find('\n')), "| epoch | train-accuracy | val-accuracy | time |");
  // --val-prefix decides where one report mixes both (bench/gpu_seed001.sh).
  ASSERT_OK(tracker::RunAndCapture(
      {pstrain::testing::PstrainBinary(), "parse-log", MxnetLog("ilsvrc12/incept_4"),
       "--metric-names", "accuracy", "--val-prefix", "valid"},
      Environment().All(), 30000, &out, &status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_EQ(out.substr(0, out.find('\n')), "| epoch | train-accuracy | valid-accuracy | time |");
  ASSERT_OK(tracker::RunAndCapture({pstrain::testing::PstrainBinary(), "parse-log",
                                    MxnetLog("ilsvrc12/incept_4"), "--val-prefix", "value"},
                                   Environment().All(), 30000, &out, &status));
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_NE(out.find("--val-prefix 'value' is not valid or val"), std::string::npos) << out;
  ASSERT_OK(tracker::RunAndCapture({pstrain::testing::PstrainBinary(), "parse-log", "/nonexistent"},
                                   Environment().All(), 30000, &out, &status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_NE(out.find("no such log: '/nonexistent'"), std::string::npos) << out;
}

}  // namespace
}  // namespace pstrain::logtools
