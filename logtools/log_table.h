// Accuracy-per-epoch tables from training logs, as MXNet's tools/parse_log.py
// makes them (../shared/reference/mxnet_facts.md sections 3.5 and 4).
//
// A log is one file, or a job directory written by `pstrain launch` (its
// worker-*.log files, or every *.log file when there are none). Lines are
// read by ParseLogLine (log_line.h), wherever "Epoch[N] " occurs in them, so prefixes such as
// "INFO:root:", a timestamp or the launcher's "[worker-1] " do not matter:
//   Epoch[N] Train-<metric>=<value>
//   Epoch[N] Validation-<metric>=<value>
//   Epoch[N] Time cost=<seconds>
// Batch lines ("Epoch[N] Batch [B]\tSpeed: ...") are not epoch results and are
// skipped. Lines of several workers may be interleaved in one file: every value
// for an epoch is collected, and the table shows their mean (or maximum) with
// the epoch printed 1-based. Time is always the mean.
#ifndef PSTRAIN_LOGTOOLS_LOG_TABLE_H_
#define PSTRAIN_LOGTOOLS_LOG_TABLE_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pstrain::logtools {

// All values found for one epoch, in the order they were read.
struct EpochValues {
  std::vector<std::vector<double>> train;  // [metric][occurrence]
  std::vector<std::vector<double>> valid;  // [metric][occurrence]
  std::vector<double> time;
};

struct ParsedLog {
  std::string name;                   // the path it was read from
  std::vector<std::string> metrics;   // the metric names looked for
  std::map<int, EpochValues> epochs;  // key: epoch as logged (0-based)
  int lines_matched = 0;
  std::set<std::string> metrics_seen;  // every Train-/Validation- metric name read
};

// Collects epoch results line by line.
class LogAccumulator {
 public:
  LogAccumulator(std::string name, std::vector<std::string> metrics);
  // Records the epoch result on `line` (without its newline), if it has one.
  void AddLine(std::string_view line);
  // Feeds every line of `text`.
  void AddText(std::string_view text);
  const ParsedLog& log() const { return log_; }
  ParsedLog Release() { return std::move(log_); }

 private:
  EpochValues& Epoch(int epoch);
  ParsedLog log_;
};

// Reads a file or a job directory. NotFound if it does not exist or the
// directory has no log files; InvalidArgument if nothing in it is an epoch
// result for `metrics`, or if the log has epoch results of other metrics but
// none of one of `metrics` (a misspelt --metric-names; the error lists the
// names it has).
StatusOr<ParsedLog> ReadLog(const std::string& path, const std::vector<std::string>& metrics);

enum class Op { kAvg, kMax };
StatusOr<Op> ParseOp(const std::string& s);

struct TableRow {
  int epoch = 0;                             // 1-based
  std::vector<std::optional<double>> train;  // per metric; nullopt: not logged
  std::vector<std::optional<double>> valid;
  std::optional<double> time;
};

// One row per logged epoch, ascending.
std::vector<TableRow> Summarize(const ParsedLog& log, Op op);

enum class TableFormat { kMarkdown, kNone, kTsv, kCsv };
StatusOr<TableFormat> ParseTableFormat(const std::string& s);

// Which MXNet parse_log.py's column names a table takes: 2015's (the seeds'
// tables) head validation columns "valid-<m>", 1.x's (the one with
// --metric-names) "val-<m>".
enum class Header { kMxnet2015, kMxnet1x };

// markdown: "| epoch | train-accuracy | valid-accuracy | time |", "| --- | ...",
// rows "| %2d | %f | %f | %.1f |" (MXNet's parse_log.py); none (its other
// format): the same columns separated by tabs, epoch as "%2d"; tsv and csv:
// separated by tabs or commas, epoch as "%d". A missing value is "-" in
// markdown and empty otherwise.
std::string FormatTable(const std::vector<TableRow>& rows, const std::vector<std::string>& metrics,
                        TableFormat format, Header header = Header::kMxnet2015);

// An SVG chart of metric `metric_index` per epoch: for each log, its
// validation curve (solid) and training curve (dashed) in one colour, with
// axes, grid, ticks and a legend.
std::string PlotSvg(const std::vector<std::pair<std::string, std::vector<TableRow>>>& logs,
                    const std::string& metric, size_t metric_index);

}  // namespace pstrain::logtools

#endif  // PSTRAIN_LOGTOOLS_LOG_TABLE_H_
