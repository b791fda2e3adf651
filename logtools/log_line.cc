#include "logtools/log_line.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace pstrain::logtools {
namespace {

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// Parses a finite number at the start of `s` (strtod syntax); false if there
// is none. "nan" and "inf" are not numbers here, as MXNet's parse_log.py
// (`=([.\d]+)`) skips such lines: a worker without examples logs
// accuracy=nan, and the epoch's average is of the others.
bool ParseNumber(std::string_view s, double* out) {
  std::string buf(s.substr(0, std::min<size_t>(s.size(), 64)));
  char* end = nullptr;
  double v = std::strtod(buf.c_str(), &end);
  if (end == buf.c_str() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// Digits at the start of `s` (at most 18): their value, and how many there
// were in *len (0: none).
int64_t ParseDigits(std::string_view s, size_t* len) {
  size_t n = 0;
  int64_t v = 0;
  while (n < s.size() && n < 18 && s[n] >= '0' && s[n] <= '9') {
    v = v * 10 + (s[n] - '0');
    ++n;
  }
  *len = n;
  return v;
}

// "<B> batches of <S> samples; --num-epochs <T>" (after "Epoch[N] Start: ").
bool ParseEpochStart(std::string_view rest, LogLine* out) {
  size_t n = 0;
  const int64_t batches = ParseDigits(rest, &n);
  if (n == 0 || !StartsWith(rest.substr(n), " batches of ")) return false;
  rest.remove_prefix(n + 12);
  const int64_t batch_size = ParseDigits(rest, &n);
  if (n == 0 || !StartsWith(rest.substr(n), " samples; --num-epochs ")) return false;
  rest.remove_prefix(n + 23);
  const int64_t epochs = ParseDigits(rest, &n);
  if (n == 0 || n > 9) return false;
  out->kind = LogLine::Kind::kEpochStart;
  out->epoch_batches = batches;
  out->batch_size = batch_size;
  out->num_epochs = static_cast<int>(epochs);
  return true;
}

// A record that starts with "Epoch[N] " at `at`: Time cost, Train-, Validation-,
// Start. False (and *out untouched) for anything else, batch lines included.
bool ParseEpochRecord(std::string_view line, size_t at, LogLine* out) {
  size_t p = at + 6;  // after "Epoch["
  size_t n = 0;
  const int64_t epoch = ParseDigits(line.substr(p), &n);
  if (n == 0 || n > 9 || p + n + 1 >= line.size() || line[p + n] != ']' || line[p + n + 1] != ' ') {
    return false;
  }
  std::string_view rest = line.substr(p + n + 2);
  LogLine r;
  r.epoch = static_cast<int>(epoch);
  if (StartsWith(rest, "Time cost=")) {
    if (!ParseNumber(rest.substr(10), &r.seconds)) return false;
    r.kind = LogLine::Kind::kTimeCost;
  } else if (StartsWith(rest, "Start: ")) {
    if (!ParseEpochStart(rest.substr(7), &r)) return false;
  } else {
    const bool train = StartsWith(rest, "Train-");
    const bool valid = StartsWith(rest, "Validation-");
    if (!train && !valid) return false;
    rest.remove_prefix(train ? 6 : 11);
    const size_t eq = rest.find('=');
    double value = 0;
    if (eq == std::string_view::npos || !ParseNumber(rest.substr(eq + 1), &value)) return false;
    r.kind = train ? LogLine::Kind::kTrainMetric : LogLine::Kind::kValidationMetric;
    r.metrics.emplace_back(std::string(rest.substr(0, eq)), value);
  }
  *out = std::move(r);
  return true;
}

// The epoch of "Epoch[N] " or "Iter[N] " ending just before `at`; -1 if none.
int EpochBefore(std::string_view line, size_t at) {
  if (at < 4 || line[at - 1] != ' ' || line[at - 2] != ']') return -1;
  size_t start = at - 2;
  while (start > 0 && line[start - 1] >= '0' && line[start - 1] <= '9') --start;
  const size_t digits = at - 2 - start;
  if (digits == 0 || digits > 9) return -1;
  std::string_view head = line.substr(0, start);
  if (head.size() < 5) return -1;
  const bool epoch = head.size() >= 6 && head.substr(head.size() - 6) == "Epoch[";
  const bool iter = head.substr(head.size() - 5) == "Iter[";
  if (!epoch && !iter) return -1;
  size_t n = 0;
  return static_cast<int>(ParseDigits(line.substr(start), &n));
}

// A speedometer record "Batch [B]<spaces>Speed: X samples/sec..." at `at`.
bool ParseBatchRecord(std::string_view line, size_t at, LogLine* out) {
  std::string_view rest = line.substr(at + 7);  // after "Batch ["
  size_t n = 0;
  int64_t batch = ParseDigits(rest, &n);
  if (n == 0) return false;
  rest.remove_prefix(n);
  if (StartsWith(rest, "-")) {  // MXNet 1.4+: [first-last]
    batch = ParseDigits(rest.substr(1), &n);
    if (n == 0) return false;
    rest.remove_prefix(1 + n);
  }
  if (!StartsWith(rest, "]")) return false;
  rest.remove_prefix(1);
  size_t space = 0;
  while (space < rest.size() && (rest[space] == '\t' || rest[space] == ' ')) ++space;
  if (space == 0 || !StartsWith(rest.substr(space), "Speed: ")) return false;
  rest.remove_prefix(space + 7);
  LogLine r;
  if (!ParseNumber(rest, &r.samples_per_sec)) return false;
  r.kind = LogLine::Kind::kBatch;
  r.batch = batch;
  r.epoch = EpochBefore(line, at);
  // Metrics: "\tname=value" fields after the speed.
  size_t tab = rest.find('\t');
  while (tab != std::string_view::npos) {
    rest.remove_prefix(tab + 1);
    tab = rest.find('\t');
    std::string_view field = rest.substr(0, tab);
    const size_t eq = field.find('=');
    double value = 0;
    if (eq == 0 || eq == std::string_view::npos || !ParseNumber(field.substr(eq + 1), &value)) {
      break;
    }
    std::string_view name = field.substr(0, eq);
    if (StartsWith(name, "Train-")) name.remove_prefix(6);
    r.metrics.emplace_back(std::string(name), value);
  }
  *out = std::move(r);
  return true;
}

}  // namespace

LogLine ParseLogLine(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  LogLine out;
  for (size_t at = line.find("Epoch["); at != std::string_view::npos;
       at = line.find("Epoch[", at + 1)) {
    if (ParseEpochRecord(line, at, &out)) return out;
  }
  for (size_t at = line.find("Batch ["); at != std::string_view::npos;
       at = line.find("Batch [", at + 1)) {
    if (ParseBatchRecord(line, at, &out)) return out;
  }
  return out;
}

}  // namespace pstrain::logtools
