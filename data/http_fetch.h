// Fetching one file over HTTP(S) (libcurl) from a list of mirrors, checked
// against its SHA-256, resumed where a transfer broke off.
//
// The bytes go to "<path>.part"; the file gets its final name only once its
// size and digest match, so a partial or wrong file never sits under the final
// name. A later call resumes a .part file left by an earlier one (HTTP Range;
// the answer must be 206 with a Content-Range starting where asked, a 200
// restarts from the first byte). A digest mismatch deletes the .part file and
// tries the next mirror. libcurl honours the usual proxy variables
// (https_proxy, http_proxy, no_proxy).
#ifndef PSTRAIN_DATA_HTTP_FETCH_H_
#define PSTRAIN_DATA_HTTP_FETCH_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain {

// Where FetchFile reports how a download goes. Called from the fetching
// thread only.
class FetchProgress {
 public:
  virtual ~FetchProgress() = default;
  // During a transfer, often: `done` of `total` bytes (0: unknown) of `name`,
  // at `bytes_per_second` over the current transfer.
  virtual void Update(const std::string& name, int64_t done, int64_t total,
                      double bytes_per_second) = 0;
  // An event worth a line of its own (a file fetched, a mirror failing).
  virtual void Line(const std::string& text) = 0;
};

// Progress on `out`. With `tty`, one line rewritten in place (bytes of total,
// rate, time left) at most 10 times a second, and Line() above it; without,
// only the Line()s, one per event.
std::unique_ptr<FetchProgress> NewConsoleProgress(std::FILE* out, bool tty);

struct FetchOptions {
  // Giving up on a connection that has not opened after this long.
  int64_t connect_timeout_ms = 20000;
  // A transfer below low_speed_bytes per second for low_speed_seconds is
  // abandoned (then resumed, or the next mirror tried): no wait is unbounded.
  int64_t low_speed_bytes = 1000;
  int64_t low_speed_seconds = 30;
  // Transfers per mirror that may break off and be resumed, as long as each
  // one brings new bytes.
  int attempts_per_mirror = 3;
  FetchProgress* progress = nullptr;  // not owned; may be null
  // Origins ("https://host:port") no connection could be made to. FetchFile
  // adds to it and tries their URLs last, so the files of one data set do
  // not each wait for the same dead mirror. Not owned; may be null.
  std::set<std::string>* unreachable = nullptr;
};

struct FetchSpec {
  std::vector<std::string> urls;  // tried in order: http://, https:// or file://
  std::string path;               // the final file
  std::string label;              // for messages ("mnist train-images-idx3-ubyte.gz")
  int64_t size = 0;               // expected bytes; 0: unknown
  std::string sha256;             // expected digest, lower-case hex (required)
};

struct FetchResult {
  std::string url;           // the mirror that delivered the file
  int64_t bytes = 0;         // the file's size
  int64_t transferred = 0;   // bytes received in this call
  int64_t resumed_from = 0;  // the first transfer's start (> 0: a .part file was resumed)
  double seconds = 0;        // wall time of this call
};

// Fetches spec.path from the first mirror that delivers the right bytes.
// Errors: Unavailable (or Corruption when every mirror's bytes were wrong)
// whose message lists each URL with what went wrong there (HTTP status,
// libcurl's error, size or digest expected vs got). A .part file with good
// bytes so far is kept for the next call to resume.
StatusOr<FetchResult> FetchFile(const FetchSpec& spec, const FetchOptions& options);

// "9.5 MB", "170.1 MB", "512 B": sizes for people.
std::string HumanBytes(double bytes);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_HTTP_FETCH_H_
