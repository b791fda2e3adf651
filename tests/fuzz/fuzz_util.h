// Helpers of the libFuzzer harnesses (tests/fuzz/) and their seed writer: the
// input as a file for the readers that take a path (a memfd: no disk), a
// splitter into parts, and gzip.
#ifndef PSTRAIN_TESTS_FUZZ_FUZZ_UTIL_H_
#define PSTRAIN_TESTS_FUZZ_FUZZ_UTIL_H_

#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace pstrain::fuzz {

// A private directory for the process's links, removed at exit.
inline const std::string& LinkDir() {
  static const std::string dir = [] {
    std::string tmpl = "/tmp/pstrain-fuzz-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    static std::string to_remove = tmpl;
    std::atexit([] { (void)!system(("rm -rf " + to_remove).c_str()); });
    return tmpl;
  }();
  return dir;
}

// `bytes` as an anonymous in-memory file, at /proc/self/fd/N while it lives.
// With a `name` ("images.gz": readers choose by the extension) the path is a
// link of that name to it.
class MemFile {
 public:
  explicit MemFile(std::string_view bytes, const std::string& name = "") {
    fd_ = memfd_create("pstrain-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    if (!bytes.empty() &&
        write(fd_, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) {
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
    if (!name.empty()) {
      const std::string link = LinkDir() + "/" + name;
      unlink(link.c_str());
      if (symlink(path_.c_str(), link.c_str()) != 0) std::abort();
      path_ = link;
    }
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Splits the input into parts: each part is a little-endian uint16 length
// followed by that many bytes (the last one takes what is left).
inline std::vector<std::string_view> SplitParts(const uint8_t* data, size_t size) {
  std::vector<std::string_view> parts;
  const char* p = reinterpret_cast<const char*>(data);
  while (size >= 2) {
    size_t n = static_cast<size_t>(data[0]) | static_cast<size_t>(data[1]) << 8;
    data += 2;
    p += 2;
    size -= 2;
    if (n > size) n = size;
    parts.emplace_back(p, n);
    data += n;
    p += n;
    size -= n;
  }
  return parts;
}

// `bytes` as a gzip stream (zlib at `level`).
inline std::string Gzip(std::string_view bytes, int level = 6) {
  const uLong bound = compressBound(static_cast<uLong>(bytes.size())) + 32;
  std::string out(bound, '\0');
  z_stream z{};
  if (deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(bound);
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

}  // namespace pstrain::fuzz

#endif  // PSTRAIN_TESTS_FUZZ_FUZZ_UTIL_H_
