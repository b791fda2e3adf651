#include "data/http_fetch.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <mutex>

#include "common/build_info.h"
#include "common/sha256.h"

namespace pstrain {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// ---- console progress ----

class ConsoleProgress : public FetchProgress {
 public:
  ConsoleProgress(std::FILE* out, bool tty) : out_(out), tty_(tty) {}
  ~ConsoleProgress() override { ClearLine(); }

  void Update(const std::string& name, int64_t done, int64_t total, double rate) override {
    if (!tty_) return;
    const auto now = Clock::now();
    // At most 10 lines a second, and the last one (done == total) once.
    if (shown_ &&
        (done == last_done_ || (now - last_ < std::chrono::milliseconds(100) && done != total))) {
      return;
    }
    last_ = now;
    last_done_ = done;
    std::string line = "  " + name + "  " + HumanBytes(static_cast<double>(done));
    if (total > 0) {
      line += StrCat(" / ", HumanBytes(static_cast<double>(total)), " (",
                     static_cast<int>(100.0 * static_cast<double>(done) / total), "%)");
    }
    line += "  " + HumanBytes(rate) + "/s";
    if (total > 0 && rate > 0 && done < total) {
      const int64_t eta = static_cast<int64_t>((total - done) / rate);
      char buf[32];
      std::snprintf(buf, sizeof(buf), "  ETA %" PRId64 ":%02" PRId64, eta / 60, eta % 60);
      line += buf;
    }
    std::fprintf(out_, "\r\033[K%s", line.c_str());
    std::fflush(out_);
    shown_ = true;
  }

  void Line(const std::string& text) override {
    ClearLine();
    std::fprintf(out_, "%s\n", text.c_str());
    std::fflush(out_);
  }

 private:
  void ClearLine() {
    if (!shown_) return;
    std::fprintf(out_, "\r\033[K");
    std::fflush(out_);
    shown_ = false;
  }

  std::FILE* out_;
  bool tty_;
  bool shown_ = false;
  Clock::time_point last_;
  int64_t last_done_ = -1;
};

// ---- one transfer ----

// What one curl transfer saw and did. The callbacks fill it in.
struct Transfer {
  int fd = -1;
  std::string url;
  std::string name;      // for progress
  int64_t offset = 0;    // where the .part file continues (0: from the start)
  int64_t expected = 0;  // the file's expected size (0: unknown)
  int64_t written = 0;   // bytes written by this transfer
  long status = 0;       // HTTP status of the last response head
  std::string content_range;
  int64_t content_length = -1;
  bool head_checked = false;
  bool restarted = false;  // the server ignored the Range: the .part file was restarted
  std::string error;       // why we stopped it (a write callback returning 0)
  Clock::time_point start;
  FetchProgress* progress = nullptr;
};

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  std::string line(data, n);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (redirects have several)
    const size_t space = line.find(' ');
    t->status = space == std::string::npos ? 0 : std::atol(line.c_str() + space + 1);
    t->content_range.clear();
    t->content_length = -1;
    return n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return n;
  const std::string key = Lower(line.substr(0, colon));
  std::string value = line.substr(colon + 1);
  while (!value.empty() && value.front() == ' ') value.erase(0, 1);
  if (key == "content-range") t->content_range = value;
  if (key == "content-length") t->content_length = std::atoll(value.c_str());
  return n;
}

// Checks the response head before the first body byte: is it what we asked for?
bool CheckHead(Transfer* t, bool http) {
  if (!http) return true;  // file://: no head, no range asked
  if (t->status == 206) {
    // "bytes START-END/TOTAL"
    int64_t start = -1, end = -1;
    char total_text[32] = {0};
    if (std::sscanf(t->content_range.c_str(), "bytes %" SCNd64 "-%" SCNd64 "/%31s", &start, &end,
                    total_text) != 3) {
      t->error = StrCat("206 with a malformed Content-Range '", t->content_range, "'");
      return false;
    }
    if (start != t->offset) {
      t->error = StrCat("asked for bytes from ", t->offset, ", the server sent from ", start,
                        " (Content-Range '", t->content_range, "')");
      return false;
    }
    if (t->expected > 0 && std::string(total_text) != "*" &&
        std::atoll(total_text) != t->expected) {
      t->error = StrCat("the server's file has ", total_text, " bytes, expected ", t->expected);
      return false;
    }
    return true;
  }
  if (t->status == 200) {
    if (t->offset > 0) {
      // The server ignored the Range: start the .part file over.
      if (::ftruncate(t->fd, 0) != 0 || ::lseek(t->fd, 0, SEEK_SET) != 0) {
        t->error = StrCat("cannot restart the .part file: ", std::strerror(errno));
        return false;
      }
      t->offset = 0;
      t->restarted = true;
    }
    if (t->expected > 0 && t->content_length >= 0 && t->content_length != t->expected) {
      t->error =
          StrCat("the server's file has ", t->content_length, " bytes, expected ", t->expected);
      return false;
    }
    return true;
  }
  t->error = StrCat("HTTP ", t->status);
  return false;
}

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  if (!t->head_checked) {
    const bool http = t->url.rfind("http", 0) == 0;
    if (!CheckHead(t, http)) return 0;
    t->head_checked = true;
  }
  // A response without a length (or with a wrong one) is stopped at the
  // file's size, not written to the disk until it ends.
  if (t->expected > 0 && t->offset + t->written + static_cast<int64_t>(n) > t->expected) {
    t->error = StrCat("the server sent more than the ", t->expected, " bytes the file has");
    return 0;
  }
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::write(t->fd, data + done, n - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      t->error = StrCat("writing the .part file: ", std::strerror(errno));
      return 0;
    }
    done += static_cast<size_t>(w);
  }
  t->written += static_cast<int64_t>(n);
  return n;
}

int OnProgress(void* user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (t->progress != nullptr && t->head_checked) {
    const double secs = std::max(1e-3, SecondsSince(t->start));
    const int64_t total = t->expected > 0 ? t->expected : (dltotal > 0 ? t->offset + dltotal : 0);
    t->progress->Update(t->name, t->offset + static_cast<int64_t>(dlnow), total,
                        static_cast<double>(dlnow) / secs);
  }
  return 0;
}

enum class Outcome {
  kDone,       // the response ended normally
  kBroken,     // cut short, stalled, reset: resuming may help
  kNextMirror  // this mirror will not do (HTTP error, refused, bad answer)
};

struct AttemptResult {
  Outcome outcome;
  std::string error;
  bool restarted = false;      // the server ignored the Range: the .part file began again
  bool range_refused = false;  // HTTP 416: the .part file is not a prefix the server knows
  bool unreachable = false;    // no connection (name not resolved, refused, timed out)
};

// "https://host:port" of a URL ("" for file://).
std::string Origin(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos || url.rfind("file:", 0) == 0) return "";
  const size_t end = url.find('/', scheme + 3);
  return url.substr(0, end);
}

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// One GET of `url` into `part`, continuing at its current size.
AttemptResult RunTransfer(const std::string& url, const std::string& part, const FetchSpec& spec,
                          const FetchOptions& opt) {
  const bool http = url.rfind("http", 0) == 0;
  int64_t have = std::max<int64_t>(0, FileSize(part));
  if (!http) have = 0;  // file:// mirrors are local: copy from the start
  Transfer t;
  t.fd = ::open(part.c_str(), O_WRONLY | O_CREAT | (have == 0 ? O_TRUNC : 0) | O_CLOEXEC, 0644);
  if (t.fd < 0) {
    return {Outcome::kNextMirror, StrCat("cannot open ", part, ": ", std::strerror(errno))};
  }
  if (::lseek(t.fd, have, SEEK_SET) != have) {
    ::close(t.fd);
    return {Outcome::kNextMirror, StrCat("cannot seek in ", part, ": ", std::strerror(errno))};
  }
  t.url = url;
  t.name = spec.label;
  t.offset = have;
  t.expected = spec.size;
  t.start = Clock::now();
  t.progress = opt.progress;

  InitCurlOnce();
  CURL* curl = curl_easy_init();
  char errbuf[CURL_ERROR_SIZE] = {0};
  const std::string range = StrCat(have, "-");
  const std::string agent = StrCat("pstrain/", BuildId());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https,file");
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, agent.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTP_CONTENT_DECODING, 0L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opt.connect_timeout_ms));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, static_cast<long>(opt.low_speed_bytes));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(opt.low_speed_seconds));
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, &OnProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  if (have > 0) curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
  const CURLcode code = curl_easy_perform(curl);
  curl_easy_cleanup(curl);
  const bool closed = ::close(t.fd) == 0;

  AttemptResult r;
  r.restarted = t.restarted;
  r.range_refused = t.status == 416 && have > 0;
  if (!t.error.empty()) {
    // We stopped it: the answer was wrong for us.
    r.outcome = t.status == 416 ? Outcome::kBroken : Outcome::kNextMirror;
    r.error = t.error;
    return r;
  }
  if (code == CURLE_OK && !t.head_checked) {
    // An empty body: fine only for an empty file.
    if (http && !(t.status == 200 || (t.status == 206 && have == 0))) {
      r.outcome = t.status == 416 ? Outcome::kBroken : Outcome::kNextMirror;
      r.error = StrCat("HTTP ", t.status);
      return r;
    }
  }
  if (code == CURLE_OK) {
    if (!closed) return {Outcome::kNextMirror, StrCat("closing ", part, " failed")};
    return {Outcome::kDone, ""};
  }
  r.error = StrCat(t.written > 0 ? StrCat("after ", t.written, " bytes: ") : std::string(),
                   errbuf[0] ? errbuf : curl_easy_strerror(code));
  r.unreachable = code == CURLE_COULDNT_RESOLVE_HOST || code == CURLE_COULDNT_CONNECT ||
                  code == CURLE_COULDNT_RESOLVE_PROXY ||
                  (code == CURLE_OPERATION_TIMEDOUT && t.status == 0 && t.written == 0);
  switch (code) {
    case CURLE_PARTIAL_FILE:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2_STREAM:
      r.outcome = t.written > 0 ? Outcome::kBroken : Outcome::kNextMirror;
      break;
    default:
      r.outcome = Outcome::kNextMirror;
  }
  return r;
}

}  // namespace

std::unique_ptr<FetchProgress> NewConsoleProgress(std::FILE* out, bool tty) {
  return std::make_unique<ConsoleProgress>(out, tty);
}

std::string HumanBytes(double bytes) {
  char buf[32];
  if (bytes < 1000) {
    std::snprintf(buf, sizeof(buf), "%.0f B", bytes);
  } else if (bytes < 1e6) {
    std::snprintf(buf, sizeof(buf), "%.1f kB", bytes / 1e3);
  } else if (bytes < 1e9) {
    std::snprintf(buf, sizeof(buf), "%.1f MB", bytes / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f GB", bytes / 1e9);
  }
  return buf;
}

StatusOr<FetchResult> FetchFile(const FetchSpec& spec, const FetchOptions& opt) {
  if (spec.urls.empty()) {
    return Status::InvalidArgument(StrCat(spec.label, ": no mirror to fetch it from"));
  }
  const std::string part = spec.path + ".part";
  const auto start = Clock::now();
  FetchResult result;
  result.resumed_from = std::max<int64_t>(0, FileSize(part));
  std::vector<std::string> failures;
  bool only_bad_bytes = true;  // every mirror delivered, but the digest was wrong
  auto say = [&](const std::string& text) {
    if (opt.progress != nullptr) opt.progress->Line(text);
  };

  // Moves the checked .part file to its final name.
  auto finish = [&](const std::string& url, int64_t size) -> StatusOr<FetchResult> {
    const int fd = ::open(part.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ::fsync(fd);  // the bytes are on disk before the name says they are there
      ::close(fd);
    }
    if (std::rename(part.c_str(), spec.path.c_str()) != 0) {
      return Status::IOError(
          StrCat("cannot rename ", part, " to ", spec.path, ": ", std::strerror(errno)));
    }
    result.url = url;
    result.bytes = size;
    result.seconds = SecondsSince(start);
    return result;
  };
  // A whole .part file left by an earlier call needs no transfer, only a check.
  if (spec.size > 0 && result.resumed_from == spec.size) {
    ASSIGN_OR_RETURN(std::string got, Sha256FileHex(part));
    if (got == spec.sha256) return finish("(" + part + ", fetched before)", spec.size);
    say(StrCat(spec.label, ": ", part, " left by an earlier run has the wrong digest: deleted"));
    std::remove(part.c_str());
    result.resumed_from = 0;
  }

  // Mirrors known to be unreachable go last.
  std::vector<std::string> urls;
  for (int pass = 0; pass < 2; ++pass) {
    for (const std::string& url : spec.urls) {
      const bool dead = opt.unreachable != nullptr && opt.unreachable->count(Origin(url)) > 0;
      if (dead == (pass == 1)) urls.push_back(url);
    }
  }
  for (const std::string& url : urls) {
    std::string why;  // this mirror's failure; empty while it may still deliver
    bool complete = false;
    for (int attempt = 1; attempt <= std::max(1, opt.attempts_per_mirror); ++attempt) {
      int64_t have = std::max<int64_t>(0, FileSize(part));
      if (spec.size > 0 && have > spec.size) {
        std::remove(part.c_str());  // longer than the file can be: not ours
        have = 0;
      }
      if (spec.size > 0 && have == spec.size) {
        complete = true;  // an earlier attempt finished it
        break;
      }
      const int64_t before = have;
      AttemptResult a = RunTransfer(url, part, spec, opt);
      const int64_t now_have = std::max<int64_t>(0, FileSize(part));
      result.transferred += std::max<int64_t>(0, a.restarted ? now_have : now_have - before);
      if (a.restarted) say(StrCat(spec.label, ": ", url, " ignored the range: restarted"));
      if (a.outcome == Outcome::kNextMirror) {
        why = a.error;
        if (a.unreachable && opt.unreachable != nullptr && !Origin(url).empty()) {
          opt.unreachable->insert(Origin(url));
        }
        break;
      }
      if (a.outcome == Outcome::kBroken) {
        if (a.range_refused) std::remove(part.c_str());  // past the server's end: start over
        why = a.error;
        if (attempt < opt.attempts_per_mirror) {
          say(StrCat(spec.label, ": ", url, ": broken off ", a.error, "; resuming at ",
                     std::max<int64_t>(0, FileSize(part)), " bytes"));
        }
        continue;
      }
      // The response ended normally; is the file whole?
      if (spec.size > 0 && now_have < spec.size) {
        why = StrCat("the transfer ended at ", now_have, " of ", spec.size, " bytes");
        if (now_have > before && attempt < opt.attempts_per_mirror) {
          say(StrCat(spec.label, ": ", url, ": ", why, "; resuming"));
          continue;
        }
        break;
      }
      complete = true;
      break;
    }
    if (!complete) only_bad_bytes = false;
    if (complete) {
      ASSIGN_OR_RETURN(std::string got, Sha256FileHex(part));
      const int64_t size = FileSize(part);
      if (got == spec.sha256 && (spec.size == 0 || size == spec.size)) return finish(url, size);
      why = StrCat("sha256 mismatch: expected ", spec.sha256, ", got ", got, " (", size,
                   " bytes); the bytes were deleted");
      std::remove(part.c_str());
    }
    failures.push_back(StrCat(url, ": ", why));
    // The last failure is told by the error.
    if (&url != &urls.back())
      say(StrCat(spec.label, ": ", url, ": ", why, "; trying the next mirror"));
  }
  std::string msg = StrCat("could not fetch ", spec.label, " from any of ", spec.urls.size(),
                           " mirror", spec.urls.size() == 1 ? "" : "s", ":");
  for (const std::string& f : failures) msg += "\n  " + f;
  const int64_t kept = FileSize(part);
  if (kept > 0) msg += StrCat("\n  (", kept, " bytes kept in ", part, " for the next try)");
  return only_bad_bytes ? Status::Corruption(msg) : Status::Unavailable(msg);
}

}  // namespace pstrain
