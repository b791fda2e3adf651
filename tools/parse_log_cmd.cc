// pstrain parse-log FILE_OR_JOB_DIR...: accuracy-per-epoch tables from
// training logs (ours or MXNet's), and optionally an SVG chart.
#include <gflags/gflags.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "logtools/log_table.h"
#include "tools/commands.h"

DEFINE_string(format, "markdown",
              "table format: markdown, none (parse_log.py's tab-separated one), tsv or csv");
DEFINE_string(metric_names, "accuracy",
              "metrics to tabulate, comma-separated (e.g. accuracy,top_k_accuracy_5); given, "
              "the validation columns are headed val-<m> as MXNet 1.x's parse_log.py heads them, "
              "else valid-<m> as the 2015 one (the seeds' tables)");
DEFINE_string(val_prefix, "",
              "the validation columns' prefix: valid (MXNet's 2015 parse_log.py) or val (1.x's); "
              "default: val when --metric-names is given, else valid");
DEFINE_string(op, "avg", "how values of several workers combine: avg or max (time: always avg)");
DEFINE_string(plot, "", "also write an SVG chart of the first metric per epoch to this file");

namespace pstrain {

int RunParseLog(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: pstrain parse-log FILE_OR_JOB_DIR... [--format markdown|none|tsv|csv] "
                 "[--metric-names accuracy,...] [--val-prefix valid|val] [--op avg|max] "
                 "[--plot FILE.svg]\n");
    return 2;
  }
  auto format = logtools::ParseTableFormat(FLAGS_format);
  auto op = logtools::ParseOp(FLAGS_op);
  for (const Status& s : {format.status(), op.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "pstrain parse-log: %s\n", s.message().c_str());
      return 2;
    }
  }
  std::vector<std::string> metrics;
  size_t start = 0;
  while (start <= FLAGS_metric_names.size()) {
    size_t comma = FLAGS_metric_names.find(',', start);
    if (comma == std::string::npos) comma = FLAGS_metric_names.size();
    std::string m = FLAGS_metric_names.substr(start, comma - start);
    if (!m.empty()) metrics.push_back(m);
    start = comma + 1;
  }
  if (metrics.empty()) {
    std::fprintf(stderr, "pstrain parse-log: --metric-names is empty\n");
    return 2;
  }

  // --metric-names is 1.x's option: whoever names metrics gets its column
  // names, unless --val-prefix says.
  logtools::Header header = gflags::GetCommandLineFlagInfoOrDie("metric_names").is_default
                                ? logtools::Header::kMxnet2015
                                : logtools::Header::kMxnet1x;
  if (FLAGS_val_prefix == "valid") {
    header = logtools::Header::kMxnet2015;
  } else if (FLAGS_val_prefix == "val") {
    header = logtools::Header::kMxnet1x;
  } else if (!FLAGS_val_prefix.empty()) {
    std::fprintf(stderr, "pstrain parse-log: --val-prefix '%s' is not valid or val\n",
                 FLAGS_val_prefix.c_str());
    return 2;
  }

  std::vector<std::pair<std::string, std::vector<logtools::TableRow>>> tables;
  for (int i = 1; i < argc; ++i) {
    auto log = logtools::ReadLog(argv[i], metrics);
    if (!log.ok()) {
      std::fprintf(stderr, "pstrain parse-log: %s\n", log.status().message().c_str());
      return 1;
    }
    tables.emplace_back(log->name, logtools::Summarize(*log, *op));
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    if (tables.size() > 1) {
      std::printf("%s%s %s\n\n", i ? "\n" : "",
                  *format == logtools::TableFormat::kMarkdown ? "###" : "#",
                  tables[i].first.c_str());
    }
    std::fputs(logtools::FormatTable(tables[i].second, metrics, *format, header).c_str(), stdout);
  }
  if (!FLAGS_plot.empty()) {
    std::ofstream out(FLAGS_plot, std::ios::binary | std::ios::trunc);
    out << logtools::PlotSvg(tables, metrics[0], 0);
    out.close();
    if (!out) {
      std::fprintf(stderr, "pstrain parse-log: cannot write '%s'\n", FLAGS_plot.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace pstrain
