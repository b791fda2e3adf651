#include "logtools/job_view.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "common/job_cause.h"
#include "logtools/log_line.h"

namespace pstrain::logtools {
namespace {

constexpr size_t kMaxLine = 64 * 1024;  // a longer "line" is cut, as the supervisor cuts it

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::string UtcNow() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm utc;
  gmtime_r(&ts.tv_sec, &utc);
  char buf[64];
  size_t n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(buf + n, sizeof(buf) - n, ".%03dZ", static_cast<int>(ts.tv_nsec / 1000000));
  return buf;
}

// Spaces and control characters would break the one-line format.
std::string OneWord(const std::string& s) {
  std::string out = s.empty() ? std::string("-") : s;
  for (char& c : out) {
    if (static_cast<unsigned char>(c) <= ' ') c = '_';
  }
  return out;
}

std::string OneLine(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

// Splits off the next space-separated word of *rest.
std::string_view NextWord(std::string_view* rest) {
  size_t space = rest->find(' ');
  std::string_view word = rest->substr(0, space);
  rest->remove_prefix(space == std::string_view::npos ? rest->size() : space + 1);
  return word;
}

// "key=<int>": the value; false when `word` is not that.
bool IntField(std::string_view word, std::string_view key, int* out) {
  if (!StartsWith(word, key) || word.size() <= key.size() || word[key.size()] != '=') {
    return false;
  }
  std::string digits(word.substr(key.size() + 1));
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  *out = std::stoi(digits);
  return true;
}

std::string SignalText(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? StrCat("SIG", abbrev) : StrCat("signal ", sig);
}

// Sort key: scheduler, servers, workers, the rest; then rank; then name.
std::tuple<int, long, std::string> OrderKey(const std::string& name) {
  const size_t dash = name.rfind('-');
  std::string role = name.substr(0, dash);
  long rank = -1;
  if (dash != std::string::npos && dash + 1 < name.size() && name.size() - dash - 1 <= 9 &&
      std::all_of(name.begin() + static_cast<long>(dash) + 1, name.end(),
                  [](char c) { return c >= '0' && c <= '9'; })) {
    rank = std::stol(name.substr(dash + 1));
  } else {
    role = name;
  }
  const int group = role == "scheduler" ? 0 : role == "server" ? 1 : role == "worker" ? 2 : 3;
  return {group, rank, group == 3 ? name : std::string()};
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Duration(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%ld:%02ld", s / 60, s % 60);
  }
  return buf;
}

// What a terminal shows one column per byte: printable ASCII.
std::string Printable(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) c = u == '\t' ? ' ' : '?';
  }
  return out;
}

bool ContainsNoCase(std::string_view s, std::string_view word) {
  auto it = std::search(s.begin(), s.end(), word.begin(), word.end(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) == b;
  });
  return it != s.end();
}

}  // namespace

std::string FormatJobEvent(const JobEvent& e) {
  std::string line = e.time.empty() ? UtcNow() : OneWord(e.time);
  switch (e.kind) {
    case JobEvent::Kind::kJob:
      line += StrCat(" job pid=", e.pid, " host=", OneWord(e.host), " id=", OneLine(e.name));
      break;
    case JobEvent::Kind::kStart:
      line += StrCat(" start ", OneWord(e.name), " pid=", e.pid, " host=", OneLine(e.host));
      break;
    case JobEvent::Kind::kExit:
      line += StrCat(" exit ", OneWord(e.name));
      if (e.signal != 0) {
        line += StrCat(" signal=", e.signal, e.stopped ? " stopped" : "");
      } else {
        line += StrCat(" code=", e.exit_code);
      }
      break;
    case JobEvent::Kind::kEnd:
      line += StrCat(" end ", e.ok ? "ok " : "failed ", OneLine(e.text));
      break;
  }
  return line;
}

bool ParseJobEvent(std::string_view line, JobEvent* event) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  JobEvent e;
  e.time = std::string(NextWord(&line));
  const std::string_view kind = NextWord(&line);
  if (e.time.empty()) return false;
  if (kind == "job") {
    e.kind = JobEvent::Kind::kJob;
    if (!IntField(NextWord(&line), "pid", &e.pid)) return false;
    std::string_view host = NextWord(&line);
    if (!StartsWith(host, "host=") || !StartsWith(line, "id=")) return false;
    e.host = std::string(host.substr(5));
    e.name = std::string(line.substr(3));
  } else if (kind == "start") {
    e.kind = JobEvent::Kind::kStart;
    e.name = std::string(NextWord(&line));
    if (e.name.empty() || !IntField(NextWord(&line), "pid", &e.pid)) return false;
    if (!StartsWith(line, "host=")) return false;
    e.host = std::string(line.substr(5));
  } else if (kind == "exit") {
    e.kind = JobEvent::Kind::kExit;
    e.name = std::string(NextWord(&line));
    const std::string_view what = NextWord(&line);
    if (e.name.empty()) return false;
    if (IntField(what, "signal", &e.signal)) {
      e.stopped = line == "stopped";
    } else if (!IntField(what, "code", &e.exit_code)) {
      return false;
    }
  } else if (kind == "end") {
    e.kind = JobEvent::Kind::kEnd;
    const std::string_view how = NextWord(&line);
    if (how != "ok" && how != "failed") return false;
    e.ok = how == "ok";
    e.text = std::string(line);
  } else {
    return false;
  }
  *event = std::move(e);
  return true;
}

std::optional<double> ProcessView::EpochEtaSeconds() const {
  if (epoch < 0 || epoch_ended || epoch_batches <= 0 || batch_size <= 0 || samples_per_sec <= 0) {
    return std::nullopt;
  }
  if (state != ProcessState::kRunning && state != ProcessState::kUnknown) return std::nullopt;
  const int64_t left = std::max<int64_t>(0, epoch_batches - batches_done);
  return static_cast<double>(left * batch_size) / samples_per_sec;
}

std::string ProcessView::StateText() const {
  switch (state) {
    case ProcessState::kUnknown:
      return "unknown";
    case ProcessState::kStarting:
      return starts > 1 ? "restarting" : "starting";
    case ProcessState::kRunning:
      return "running";
    case ProcessState::kDone:
      return "done";
    case ProcessState::kFailed:
      return signal != 0 ? StrCat("failed(", SignalText(signal), ")")
                         : StrCat("failed(", exit_code, ")");
    case ProcessState::kStopped:
      return "stopped";
  }
  return "?";
}

ProcessView& JobView::Get(const std::string& name) {
  auto key = OrderKey(name);
  auto it =
      std::lower_bound(processes_.begin(), processes_.end(), key,
                       [](const ProcessView& p, const auto& k) { return OrderKey(p.name) < k; });
  if (it != processes_.end() && it->name == name) return *it;
  ProcessView p;
  p.name = name;
  return *processes_.insert(it, std::move(p));
}

const ProcessView* JobView::Find(const std::string& name) const {
  for (const ProcessView& p : processes_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

void JobView::Apply(const JobEvent& e) {
  switch (e.kind) {
    case JobEvent::Kind::kJob:
      job_id_ = e.name;
      launcher_pid_ = e.pid;
      launcher_host_ = e.host;
      break;
    case JobEvent::Kind::kStart: {
      ProcessView& p = Get(e.name);
      p.host = e.host;
      p.state = ProcessState::kStarting;
      p.exit_code = 0;
      p.signal = 0;
      ++p.starts;
      break;
    }
    case JobEvent::Kind::kExit: {
      ProcessView& p = Get(e.name);
      p.exit_code = e.exit_code;
      p.signal = e.signal;
      if (e.signal != 0) {
        p.state = e.stopped ? ProcessState::kStopped : ProcessState::kFailed;
      } else {
        p.state = e.exit_code == 0 ? ProcessState::kDone : ProcessState::kFailed;
      }
      break;
    }
    case JobEvent::Kind::kEnd:
      ended_ = true;
      ended_ok_ = e.ok;
      end_text_ = e.text;
      if (!e.ok) {
        for (ProcessView& p : processes_) {
          p.cause = e.text.size() > p.name.size() && e.text.rfind(p.name + " ", 0) == 0;
        }
      }
      break;
  }
}

void JobView::MarkLauncherGone(const std::string& why) {
  if (ended_) return;
  ended_ = true;
  ended_ok_ = false;
  end_text_ = why;
}

void JobView::AddLine(const std::string& name, std::string_view line) {
  ProcessView& p = Get(name);
  ++p.lines;
  if (p.state == ProcessState::kStarting) p.state = ProcessState::kRunning;
  const LogLine l = ParseLogLine(line);
  auto enter_epoch = [&p](int epoch) {
    if (epoch == p.epoch) return;
    p.epoch = epoch;
    p.batches_done = 0;
    p.epoch_ended = false;
  };
  switch (l.kind) {
    case LogLine::Kind::kNone:
      break;
    case LogLine::Kind::kEpochStart:
      enter_epoch(l.epoch);
      p.batches_done = 0;
      p.epoch_ended = false;
      p.epoch_batches = l.epoch_batches;
      p.batch_size = l.batch_size;
      p.num_epochs = l.num_epochs;
      break;
    case LogLine::Kind::kBatch:
      if (l.epoch >= 0) enter_epoch(l.epoch);
      p.batches_done = l.batch + 1;
      p.samples_per_sec = l.samples_per_sec;
      if (!l.metrics.empty()) {
        p.metric = StrCat(l.metrics.front().first, "=", Fixed(l.metrics.front().second, 6));
      }
      break;
    case LogLine::Kind::kTrainMetric:
    case LogLine::Kind::kValidationMetric:
      enter_epoch(l.epoch);
      p.epoch_ended = true;
      if (p.epoch_batches > 0) p.batches_done = p.epoch_batches;
      p.metric = StrCat(l.kind == LogLine::Kind::kTrainMetric ? "train-" : "val-",
                        l.metrics.front().first, "=", Fixed(l.metrics.front().second, 6));
      break;
    case LogLine::Kind::kTimeCost:
      enter_epoch(l.epoch);
      p.epoch_ended = true;
      if (p.epoch_batches > 0) p.batches_done = p.epoch_batches;
      break;
  }
}

std::vector<std::string> RenderJobView(const JobView& view, int width, int max_lines,
                                       const std::string& title) {
  const std::vector<std::string> header = {"PROCESS", "HOST",      "STATE",  "EPOCH",
                                           "BATCH",   "SAMPLES/S", "METRIC", "ETA"};
  const std::vector<bool> right = {false, false, false, true, true, true, false, true};
  constexpr size_t kMaxHost = 24;
  std::vector<std::vector<std::string>> rows;
  std::map<std::string, int> counts;
  double worker_speed = 0;
  bool any_speed = false;
  for (const ProcessView& p : view.processes()) {
    std::vector<std::string> r;
    r.push_back(Printable(p.name));
    std::string host = p.host.empty() ? std::string("-") : Printable(p.host);
    if (host.size() > kMaxHost) host = host.substr(0, kMaxHost - 1) + "~";
    r.push_back(host);
    r.push_back(p.cause ? p.StateText() + " (cause)" : p.StateText());
    const bool trained = p.epoch >= 0;
    r.push_back(!trained           ? std::string("-")
                : p.num_epochs > 0 ? StrCat(p.epoch + 1, "/", p.num_epochs)
                                   : StrCat(p.epoch + 1));
    r.push_back(!trained && p.batches_done == 0 ? std::string("-")
                : p.epoch_batches > 0           ? StrCat(p.batches_done, "/", p.epoch_batches)
                                                : StrCat(p.batches_done));
    r.push_back(p.samples_per_sec < 0 ? std::string("-") : Fixed(p.samples_per_sec, 1));
    r.push_back(p.metric.empty() ? std::string("-") : Printable(p.metric));
    const std::optional<double> eta = p.EpochEtaSeconds();
    r.push_back(eta ? Duration(*eta) : std::string("-"));
    rows.push_back(std::move(r));
    ++counts[p.state == ProcessState::kFailed ? std::string("failed") : p.StateText()];
    const bool live = p.state == ProcessState::kRunning || p.state == ProcessState::kUnknown;
    if (live && p.samples_per_sec >= 0 && std::get<0>(OrderKey(p.name)) == 2) {
      worker_speed += p.samples_per_sec;
      any_speed = true;
    }
  }
  std::vector<size_t> widths(header.size());
  for (size_t c = 0; c < header.size(); ++c) {
    widths[c] = header[c].size();
    for (const auto& r : rows) widths[c] = std::max(widths[c], r[c].size());
  }
  auto format_row = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c > 0) line += "  ";
      const std::string pad(widths[c] - cells[c].size(), ' ');
      line += right[c] ? pad + cells[c] : cells[c] + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return line;
  };

  std::string summary =
      StrCat(view.processes().size(), view.processes().size() == 1 ? " process" : " processes");
  const char* order[] = {"starting", "restarting", "running", "done",
                         "failed",   "stopped",    "unknown"};
  std::string parts;
  for (const char* s : order) {
    auto it = counts.find(s);
    if (it == counts.end()) continue;
    parts += StrCat(parts.empty() ? ": " : ", ", it->second, " ", s);
  }
  summary += parts;
  if (any_speed) summary += StrCat("; workers ", Fixed(worker_speed, 1), " samples/s");

  std::vector<std::string> lines;
  if (!title.empty()) lines.push_back(Printable(title));
  lines.push_back(format_row(header));
  const size_t fixed = lines.size() + 1;  // + the summary
  size_t shown = rows.size();
  if (max_lines > 0 && fixed + rows.size() > static_cast<size_t>(max_lines)) {
    const size_t room = static_cast<size_t>(max_lines) > fixed + 1 ? max_lines - fixed - 1 : 0;
    shown = std::min(rows.size(), room);
  }
  for (size_t i = 0; i < shown; ++i) lines.push_back(format_row(rows[i]));
  if (shown < rows.size()) {
    lines.push_back(StrCat("... ", rows.size() - shown, " more (a taller terminal shows them)"));
  }
  lines.push_back(summary);
  if (max_lines > 0 && lines.size() > static_cast<size_t>(max_lines)) lines.resize(max_lines);
  if (width > 0) {
    for (std::string& l : lines) {
      if (l.size() <= static_cast<size_t>(width)) continue;
      l.resize(width);
      while (!l.empty() && l.back() == ' ') l.pop_back();
    }
  }
  return lines;
}

bool IsImportantLine(std::string_view line) {
  // glog errors: "E20261123 01:02:03.456789 ..." (older glog: "E1123 ..."), and F.
  if (!line.empty() && (line[0] == 'E' || line[0] == 'F')) {
    size_t digits = 1;
    while (digits < line.size() && line[digits] >= '0' && line[digits] <= '9') ++digits;
    if ((digits == 5 || digits == 9) && digits < line.size() && line[digits] == ' ') return true;
  }
  for (std::string_view word : {"error", "fatal", "failed", "exception", "traceback", "abort",
                                "segmentation fault", "killed"}) {
    if (ContainsNoCase(line, word)) return true;
  }
  for (std::string_view code :
       {"InvalidArgument: ", "NotFound: ", "Corruption: ", "DeadlineExceeded: ", "Unavailable: ",
        "OutOfRange: ", "Internal: ", "Cancelled: ", "Unimplemented: "}) {
    if (line.find(code) != std::string_view::npos) return true;
  }
  return line.find(kJobCauseMarker) != std::string_view::npos;
}

JobLogFollower::JobLogFollower(std::string dir) : dir_(std::move(dir)) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
}

Status JobLogFollower::ReadNew(const std::string& path, File* f, bool* exists,
                               const std::function<void(std::string_view)>& line) {
  *exists = false;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::IOError(StrCat("cannot read '", path, "': ", strerror(errno)));
  }
  *exists = true;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return Status::IOError(StrCat("cannot stat '", path, "': ", strerror(errno)));
  }
  if (st.st_size < f->offset) {  // truncated: a new job writes to this folder
    f->offset = 0;
    f->pending.clear();
  }
  char buf[1 << 16];
  while (f->offset < st.st_size) {
    ssize_t n = pread(fd, buf, sizeof(buf), f->offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = strerror(errno);
      close(fd);
      return Status::IOError(StrCat("error reading '", path, "' at byte ", f->offset, ": ", why));
    }
    if (n == 0) break;
    f->offset += n;
    f->pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl = f->pending.find('\n'); nl != std::string::npos;
         nl = f->pending.find('\n', start)) {
      line(std::string_view(f->pending).substr(start, nl - start));
      start = nl + 1;
    }
    f->pending.erase(0, start);
    if (f->pending.size() >= kMaxLine) {
      line(f->pending);
      f->pending.clear();
    }
  }
  close(fd);
  return Status::Ok();
}

Status JobLogFollower::Poll(JobView* view) {
  DIR* dir = opendir(dir_.c_str());
  if (dir == nullptr) {
    if (errno == ENOENT) return Status::NotFound(StrCat("no such job directory: '", dir_, "'"));
    return Status::IOError(StrCat("cannot list '", dir_, "': ", strerror(errno)));
  }
  std::vector<std::string> logs;
  while (dirent* ent = readdir(dir)) {
    const std::string name = ent->d_name;
    // <role>-<rank>.log: a process's log; mpirun.log: mpirun's own lines.
    if (name == "mpirun.log") {
      logs.push_back(name);
      continue;
    }
    if (name.size() < 7 || name.compare(name.size() - 4, 4, ".log") != 0) continue;
    const std::string stem = name.substr(0, name.size() - 4);
    const size_t dash = stem.rfind('-');
    if (dash == std::string::npos || dash == 0 || dash + 1 == stem.size() ||
        !std::all_of(stem.begin() + static_cast<long>(dash) + 1, stem.end(),
                     [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    logs.push_back(name);
  }
  closedir(dir);
  std::sort(logs.begin(), logs.end());

  bool exists = false;
  RETURN_IF_ERROR(ReadNew(dir_ + "/" + kJobEventsFile, &files_[kJobEventsFile], &exists,
                          [view](std::string_view line) {
                            JobEvent e;
                            if (ParseJobEvent(line, &e)) view->Apply(e);
                          }));
  has_events_ = has_events_ || exists;
  for (const std::string& name : logs) {
    const std::string process = name.substr(0, name.size() - 4);
    RETURN_IF_ERROR(
        ReadNew(dir_ + "/" + name, &files_[name], &exists, [view, &process](std::string_view line) {
          if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
          view->AddLine(process, line);
        }));
  }
  return Status::Ok();
}

}  // namespace pstrain::logtools
