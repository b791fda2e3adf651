#include "logtools/log_table.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "logtools/log_line.h"

namespace pstrain::logtools {
namespace {

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace

LogAccumulator::LogAccumulator(std::string name, std::vector<std::string> metrics) {
  log_.name = std::move(name);
  log_.metrics = std::move(metrics);
}

EpochValues& LogAccumulator::Epoch(int epoch) {
  EpochValues& e = log_.epochs[epoch];
  if (e.train.empty()) {
    e.train.resize(log_.metrics.size());
    e.valid.resize(log_.metrics.size());
  }
  return e;
}

void LogAccumulator::AddLine(std::string_view line) {
  const LogLine parsed = ParseLogLine(line);
  switch (parsed.kind) {
    case LogLine::Kind::kTimeCost:
      Epoch(parsed.epoch).time.push_back(parsed.seconds);
      ++log_.lines_matched;
      return;
    case LogLine::Kind::kTrainMetric:
    case LogLine::Kind::kValidationMetric: {
      const auto& [metric, value] = parsed.metrics.front();
      log_.metrics_seen.insert(metric);
      auto it = std::find(log_.metrics.begin(), log_.metrics.end(), metric);
      if (it == log_.metrics.end()) return;
      size_t m = static_cast<size_t>(it - log_.metrics.begin());
      EpochValues& e = Epoch(parsed.epoch);
      (parsed.kind == LogLine::Kind::kTrainMetric ? e.train : e.valid)[m].push_back(value);
      ++log_.lines_matched;
      return;
    }
    default:
      return;  // batch and start-of-epoch lines are not epoch results
  }
}

void LogAccumulator::AddText(std::string_view text) {
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    AddLine(line);
    start = nl + 1;
  }
}

StatusOr<ParsedLog> ReadLog(const std::string& path, const std::vector<std::string>& metrics) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return Status::NotFound(StrCat("no such log: '", path, "'"));
  std::vector<std::string> files;
  if (S_ISDIR(st.st_mode)) {
    std::vector<std::string> workers, all;
    DIR* dir = opendir(path.c_str());
    if (dir == nullptr) return Status::IOError(StrCat("cannot list '", path, "'"));
    while (dirent* ent = readdir(dir)) {
      std::string name = ent->d_name;
      if (name.size() < 5 || name.compare(name.size() - 4, 4, ".log") != 0) continue;
      all.push_back(path + "/" + name);
      if (name.rfind("worker-", 0) == 0) workers.push_back(path + "/" + name);
    }
    closedir(dir);
    files = workers.empty() ? all : workers;
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      return Status::NotFound(StrCat("job directory '", path, "' has no *.log files"));
    }
  } else {
    files.push_back(path);
  }
  std::string name = path;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  LogAccumulator acc(name, metrics);
  for (const std::string& f : files) {
    std::FILE* in = std::fopen(f.c_str(), "rb");
    if (in == nullptr) return Status::IOError(StrCat("cannot read '", f, "'"));
    std::string text;
    char chunk[1 << 16];
    size_t n;
    while ((n = std::fread(chunk, 1, sizeof(chunk), in)) > 0) text.append(chunk, n);
    bool failed = std::ferror(in) != 0;
    std::fclose(in);
    if (failed) return Status::IOError(StrCat("error reading '", f, "' at byte ", text.size()));
    acc.AddText(text);
  }
  std::string names;
  for (const std::string& m : metrics) names += (names.empty() ? "" : ",") + m;
  if (acc.log().lines_matched == 0) {
    return Status::InvalidArgument(StrCat("'", path,
                                          "' has no epoch results (Epoch[N] Train-/Validation-{",
                                          names, "}= or Time cost=)"));
  }
  const std::set<std::string>& seen = acc.log().metrics_seen;
  for (const std::string& m : metrics) {
    if (seen.empty() || seen.count(m) > 0) continue;
    std::string have;
    for (const std::string& s : seen) have += (have.empty() ? "" : ", ") + s;
    return Status::InvalidArgument(StrCat("'", path, "' has no epoch results of metric '", m,
                                          "' (--metric-names ", names, "); its metrics: ", have));
  }
  return acc.Release();
}

StatusOr<Op> ParseOp(const std::string& s) {
  if (s == "avg" || s == "mean") return Op::kAvg;
  if (s == "max") return Op::kMax;
  return Status::InvalidArgument(StrCat("--op '", s, "' is not avg or max"));
}

StatusOr<TableFormat> ParseTableFormat(const std::string& s) {
  if (s == "markdown" || s == "md") return TableFormat::kMarkdown;
  if (s == "none") return TableFormat::kNone;
  if (s == "tsv") return TableFormat::kTsv;
  if (s == "csv") return TableFormat::kCsv;
  return Status::InvalidArgument(StrCat("--format '", s, "' is not markdown, none, tsv or csv"));
}

std::vector<TableRow> Summarize(const ParsedLog& log, Op op) {
  auto mean = [](const std::vector<double>& v) -> std::optional<double> {
    if (v.empty()) return std::nullopt;
    double sum = 0;
    for (double x : v) sum += x;  // in reading order, as parse_log.py sums
    return sum / static_cast<double>(v.size());
  };
  auto agg = [&](const std::vector<double>& v) -> std::optional<double> {
    if (v.empty()) return std::nullopt;
    if (op == Op::kMax) return *std::max_element(v.begin(), v.end());
    return mean(v);
  };
  std::vector<TableRow> rows;
  for (const auto& [epoch, e] : log.epochs) {
    TableRow r;
    r.epoch = epoch + 1;
    for (const auto& v : e.train) r.train.push_back(agg(v));
    for (const auto& v : e.valid) r.valid.push_back(agg(v));
    r.time = mean(e.time);
    rows.push_back(std::move(r));
  }
  return rows;
}

std::string FormatTable(const std::vector<TableRow>& rows, const std::vector<std::string>& metrics,
                        TableFormat format, Header names) {
  std::vector<std::string> header = {"epoch"};
  const char* valid = names == Header::kMxnet1x ? "val-" : "valid-";
  for (const std::string& m : metrics) header.push_back("train-" + m);
  for (const std::string& m : metrics) header.push_back(valid + m);
  header.push_back("time");
  const bool md = format == TableFormat::kMarkdown;
  const std::string sep = format == TableFormat::kCsv ? "," : "\t";
  const std::string missing = md ? "-" : "";
  std::string out;
  auto emit = [&](const std::vector<std::string>& cells) {
    if (md) {
      out += "|";
      for (const std::string& c : cells) out += " " + c + " |";
    } else {
      for (size_t i = 0; i < cells.size(); ++i) out += (i ? sep : "") + cells[i];
    }
    out += "\n";
  };
  emit(header);
  if (md) emit(std::vector<std::string>(header.size(), "---"));
  for (const TableRow& r : rows) {
    std::vector<std::string> cells;
    char epoch[16];
    std::snprintf(epoch, sizeof(epoch), md || format == TableFormat::kNone ? "%2d" : "%d", r.epoch);
    cells.push_back(epoch);
    for (const auto& v : r.train) cells.push_back(v ? Fixed(*v, 6) : missing);
    for (const auto& v : r.valid) cells.push_back(v ? Fixed(*v, 6) : missing);
    cells.push_back(r.time ? Fixed(*r.time, 1) : missing);
    emit(cells);
  }
  return out;
}

}  // namespace pstrain::logtools
