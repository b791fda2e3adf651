#include "data/file_bytes.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
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

StatusOr<std::vector<uint8_t>> ReadGzip(const std::string& path, uint64_t max_bytes) {
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
    if (out.size() + static_cast<uint64_t>(n) > max_bytes) {
      gzclose(f);
      return Status::ResourceExhausted(StrCat(path, ": decompresses to more than ", max_bytes,
                                              " bytes; not a data file read whole?"));
    }
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

Status ReadRegularFile(const std::string& path, uint64_t max_bytes, std::string* out) {
  // Checked before opening, so that a device is not opened at all (opening
  // one may act), and after, on what was opened: O_NONBLOCK keeps the open of
  // a FIFO put there meanwhile from waiting for a writer.
  struct stat before;
  if (::stat(path.c_str(), &before) == 0 && !S_ISREG(before.st_mode)) {
    return Status::InvalidArgument(
        StrCat(path, ": not a regular file (a directory, FIFO or device)"));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string why = StrCat(path, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? Status::NotFound(why) : Status::IOError(why);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return Status::IOError(StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(
        StrCat(path, ": not a regular file (a directory, FIFO or device)"));
  }
  // Blocking reads from here (a filesystem that honours the flag for files
  // would answer EAGAIN).
  (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Status::ResourceExhausted(
        StrCat(path, ": ", st.st_size, " bytes, more than the ", max_bytes, " an image may have"));
  }
  out->resize(static_cast<size_t>(st.st_size));
  size_t have = 0;
  while (have < out->size()) {
    const ssize_t n = ::read(fd, out->data() + have, out->size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return Status::IOError(
          StrCat(path, ": read error at byte offset ", have, ": ", std::strerror(errno)));
    }
    if (n == 0) break;  // shrank meanwhile: what is there
    have += static_cast<size_t>(n);
  }
  out->resize(have);
  return Status::Ok();
}

StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path, uint64_t max_gunzip_bytes) {
  if (!FileExists(path)) return Status::NotFound(StrCat(path, ": no such file"));
  if (EndsWith(path, ".gz")) return ReadGzip(path, max_gunzip_bytes);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Status::IOError(StrCat(path, ": cannot open: ", std::strerror(errno)));
  // Read straight into a buffer of the file's size (one allocation, no
  // copy); a file that grows meanwhile is read to its end all the same.
  struct stat st;
  size_t expect = ::fstat(fileno(f), &st) == 0 && st.st_size > 0 ? st.st_size : 0;
  std::vector<uint8_t> out(expect + 1);
  size_t have = 0;
  while (true) {
    const size_t n = std::fread(out.data() + have, 1, out.size() - have, f);
    have += n;
    if (have < out.size()) break;
    out.resize(out.size() + std::max<size_t>(out.size() / 2, 1 << 16));
  }
  out.resize(have);
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return Status::IOError(StrCat(path, ": read error at byte offset ", out.size()));
  return out;
}

}  // namespace pstrain
