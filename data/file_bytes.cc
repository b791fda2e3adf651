#include "data/file_bytes.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace pstrain {

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

StatusOr<std::vector<uint8_t>> ReadGzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return Status::IOError(StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  gzbuffer(f, 1 << 17);
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  while (true) {
    int n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      return Status::Corruption(StrCat(path, ": corrupt gzip stream at uncompressed byte offset ",
                                       out.size(), ": ", msg));
    }
    if (n == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  }
  int err = 0;
  const char* msg = gzerror(f, &err);
  std::string message = msg != nullptr ? msg : "";
  gzclose(f);
  if (err != Z_OK && err != Z_STREAM_END) {
    return Status::Corruption(
        StrCat(path, ": truncated or corrupt gzip stream at uncompressed byte offset ", out.size(),
               ": ", message));
  }
  return out;
}

}  // namespace

StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  if (!FileExists(path)) return Status::NotFound(StrCat(path, ": no such file"));
  if (EndsWith(path, ".gz")) return ReadGzip(path);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Status::IOError(StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  while (true) {
    size_t n = std::fread(chunk.data(), 1, chunk.size(), f);
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
    if (n < chunk.size()) break;
  }
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return Status::IOError(StrCat(path, ": read error at byte offset ", out.size()));
  return out;
}

}  // namespace pstrain
