#include "data/tar_gz.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace pstrain {
namespace {

constexpr int64_t kBlock = 512;

// A gzip stream read block by block; `offset` counts uncompressed bytes.
class GzReader {
 public:
  explicit GzReader(std::string path) : path_(std::move(path)) {}
  ~GzReader() {
    if (gz_ != nullptr) gzclose(gz_);
  }
  Status Open() {
    gz_ = gzopen(path_.c_str(), "rb");
    if (gz_ == nullptr) {
      return Status::IOError(StrCat(path_, ": cannot open: ", std::strerror(errno)));
    }
    gzbuffer(gz_, 1 << 18);
    return Status::Ok();
  }
  // Reads exactly `size` bytes; *eof set (and ok) when the stream ends cleanly
  // before the first byte.
  Status Read(void* out, int64_t size, bool* eof) {
    *eof = false;
    int64_t done = 0;
    while (done < size) {
      const unsigned want = static_cast<unsigned>(std::min<int64_t>(size - done, 1 << 30));
      int n = gzread(gz_, static_cast<char*>(out) + done, want);
      if (n < 0) return StreamError();
      if (n == 0) {
        int code = Z_OK;
        gzerror(gz_, &code);
        if (code != Z_OK) return StreamError();
        if (done == 0) {
          *eof = true;
          return Status::Ok();
        }
        return Status::Corruption(StrCat(path_, ": ends at byte offset ", offset_ + done,
                                         " of the tar stream, inside a ", size, "-byte block"));
      }
      done += n;
    }
    offset_ += size;
    return Status::Ok();
  }
  int64_t offset() const { return offset_; }
  const std::string& path() const { return path_; }

 private:
  Status StreamError() {
    int code = Z_OK;
    const char* msg = gzerror(gz_, &code);
    return Status::Corruption(StrCat(path_, ": gzip stream broken near byte offset ", offset_,
                                     " of the tar stream: ", msg != nullptr ? msg : "?"));
  }

  std::string path_;
  gzFile gz_ = nullptr;
  int64_t offset_ = 0;
};

std::string Field(const char* p, size_t n) { return std::string(p, strnlen(p, n)); }

// Sizes and numbers past this are refused: a member's size rounded up to
// whole blocks must not overflow.
constexpr uint64_t kMaxTarNumber = uint64_t{1} << 62;

// Octal (space or NUL terminated), or GNU base-256 when the top bit is set;
// false for a malformed one or one above kMaxTarNumber.
bool ParseNumber(const unsigned char* p, size_t n, int64_t* out) {
  if (p[0] & 0x80) {
    if (p[0] & 0x40) return false;  // negative
    uint64_t v = p[0] & 0x3f;
    for (size_t i = 1; i < n; ++i) {
      if (v >> 55) return false;
      v = v << 8 | p[i];
    }
    if (v > kMaxTarNumber) return false;
    *out = static_cast<int64_t>(v);
    return true;
  }
  size_t i = 0;
  while (i < n && p[i] == ' ') ++i;
  uint64_t v = 0;
  bool any = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v >> 60) return false;
    v = v * 8 + (p[i] - '0');
    any = true;
  }
  for (; i < n; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return false;
  }
  if (v > kMaxTarNumber) return false;
  *out = static_cast<int64_t>(v);
  return any;
}

bool ChecksumOk(const unsigned char* h) {
  int64_t stored;
  if (!ParseNumber(h + 148, 8, &stored)) return false;
  int64_t unsigned_sum = 0, signed_sum = 0;
  for (int i = 0; i < kBlock; ++i) {
    const bool in_field = i >= 148 && i < 156;
    unsigned_sum += in_field ? ' ' : h[i];
    signed_sum += in_field ? ' ' : static_cast<signed char>(h[i]);
  }
  return stored == unsigned_sum || stored == signed_sum;
}

// Reads a member's data (a long name or pax header) into *out.
Status ReadData(GzReader* in, int64_t size, std::string* out) {
  if (size > (int64_t{1} << 20)) {
    return Status::Corruption(StrCat(in->path(), ": header record of ", size,
                                     " bytes at byte offset ", in->offset(), " is too large"));
  }
  const int64_t padded = (size + kBlock - 1) / kBlock * kBlock;
  out->assign(static_cast<size_t>(padded), '\0');
  bool eof;
  RETURN_IF_ERROR(in->Read(out->data(), padded, &eof));
  if (eof) return Status::Corruption(StrCat(in->path(), ": ends inside a header record"));
  out->resize(static_cast<size_t>(size));
  return Status::Ok();
}

// pax records "LEN key=value\n": takes path and size.
Status ParsePax(const std::string& data, const std::string& where, std::string* path,
                int64_t* size) {
  size_t at = 0;
  while (at < data.size()) {
    size_t space = data.find(' ', at);
    if (space == std::string::npos) break;
    int64_t len = std::atoll(data.substr(at, space - at).c_str());
    // LEN counts the whole record: its own digits, the space and the '\n'.
    if (len <= 0 || static_cast<size_t>(len) < space - at + 2 || at + len > data.size() ||
        data[at + len - 1] != '\n') {
      return Status::Corruption(
          StrCat(where, ": malformed pax header record at byte ", at, " of the pax header"));
    }
    std::string rec = data.substr(space + 1, at + len - space - 2);  // drops the '\n'
    size_t eq = rec.find('=');
    if (eq != std::string::npos) {
      const std::string key = rec.substr(0, eq), value = rec.substr(eq + 1);
      if (key == "path") *path = value;
      if (key == "size" && value.empty()) {
        *size = -1;  // POSIX: an empty value deletes the keyword (the header's size holds)
      } else if (key == "size") {
        char* end = nullptr;
        errno = 0;
        const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
        if (!std::isdigit(static_cast<unsigned char>(value[0])) ||
            end != value.c_str() + value.size() || errno == ERANGE || v > kMaxTarNumber) {
          return Status::Corruption(StrCat(where, ": pax size '", value,
                                           "' is not a size (at most ", kMaxTarNumber, ")"));
        }
        *size = static_cast<int64_t>(v);
      }
    }
    at += len;
  }
  return Status::Ok();
}

// Normalizes a member path; InvalidArgument if it could leave the folder.
Status SafeRelativePath(const std::string& name, const std::string& where, std::string* out) {
  if (name.empty() || name[0] == '/') {
    return Status::InvalidArgument(
        StrCat(where, ": member '", name, "' has an absolute or empty path; refused"));
  }
  std::string result;
  size_t at = 0;
  while (at <= name.size()) {
    size_t slash = name.find('/', at);
    if (slash == std::string::npos) slash = name.size();
    const std::string part = name.substr(at, slash - at);
    at = slash + 1;
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      return Status::InvalidArgument(
          StrCat(where, ": member '", name, "' climbs out of the folder (..); refused"));
    }
    result += (result.empty() ? "" : "/") + part;
  }
  *out = result;
  return Status::Ok();
}

Status MakeDirs(const std::string& dir) {
  std::string path;
  size_t at = 0;
  while (at <= dir.size()) {
    size_t slash = dir.find('/', at);
    if (slash == std::string::npos) slash = dir.size();
    path = dir.substr(0, slash);
    at = slash + 1;
    if (path.empty()) continue;
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return Status::IOError(StrCat(path, ": cannot create folder: ", std::strerror(errno)));
    }
  }
  return Status::Ok();
}

// Copies `size` bytes of member data to `path`.part, then renames it.
Status ExtractFile(GzReader* in, int64_t size, const std::string& path) {
  const std::string part = path + ".part";
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> out(std::fopen(part.c_str(), "wb"), &std::fclose);
  if (out == nullptr) {
    return Status::IOError(StrCat(part, ": cannot create: ", std::strerror(errno)));
  }
  std::vector<char> buf(1 << 20);
  int64_t left = (size + kBlock - 1) / kBlock * kBlock;
  int64_t data_left = size;
  while (left > 0) {
    const int64_t n = std::min<int64_t>(left, static_cast<int64_t>(buf.size()));
    bool eof;
    Status s = in->Read(buf.data(), n, &eof);
    if (s.ok() && eof) {
      s = Status::Corruption(StrCat(in->path(), ": ends at byte offset ", in->offset(),
                                    " inside member ", path, " (", size, " bytes)"));
    }
    if (!s.ok()) {
      out.reset();
      std::remove(part.c_str());
      return s;
    }
    const int64_t keep = std::min(n, data_left);
    if (keep > 0 && std::fwrite(buf.data(), 1, keep, out.get()) != static_cast<size_t>(keep)) {
      const int err = errno;
      out.reset();
      std::remove(part.c_str());
      return Status::IOError(StrCat(part, ": write failed: ", std::strerror(err)));
    }
    data_left -= keep;
    left -= n;
  }
  if (std::fclose(out.release()) != 0) {
    const int err = errno;
    std::remove(part.c_str());
    return Status::IOError(StrCat(part, ": write failed: ", std::strerror(err)));
  }
  if (std::rename(part.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(part.c_str());
    return Status::IOError(StrCat("cannot rename ", part, " to ", path, ": ", std::strerror(err)));
  }
  return Status::Ok();
}

Status SkipData(GzReader* in, int64_t size) {
  std::vector<char> buf(1 << 16);
  int64_t left = (size + kBlock - 1) / kBlock * kBlock;
  while (left > 0) {
    const int64_t n = std::min<int64_t>(left, static_cast<int64_t>(buf.size()));
    bool eof;
    RETURN_IF_ERROR(in->Read(buf.data(), n, &eof));
    if (eof) return Status::Corruption(StrCat(in->path(), ": ends inside a skipped member"));
    left -= n;
  }
  return Status::Ok();
}

}  // namespace

Status UnpackTarGz(const std::string& archive, const std::string& dest_dir,
                   const UnpackOptions& options, std::vector<UnpackedFile>* files) {
  GzReader in(archive);
  RETURN_IF_ERROR(in.Open());
  std::string long_name;  // from a GNU 'L' or pax 'x' record, for the next member
  int64_t pax_size = -1;
  bool saw_header = false;
  while (true) {
    unsigned char h[kBlock];
    const int64_t header_offset = in.offset();
    bool eof;
    RETURN_IF_ERROR(in.Read(h, kBlock, &eof));
    if (eof) {
      if (!saw_header) return Status::Corruption(StrCat(archive, ": empty archive"));
      break;  // some writers omit the two zero blocks
    }
    if (std::all_of(h, h + kBlock, [](unsigned char c) { return c == 0; })) break;
    const std::string where = StrCat(archive, " (header at byte offset ", header_offset, ")");
    if (!ChecksumOk(h)) {
      return Status::Corruption(StrCat(where, ": bad tar header checksum; not a tar archive?"));
    }
    saw_header = true;
    int64_t size;
    if (!ParseNumber(h + 124, 12, &size)) {
      return Status::Corruption(StrCat(where, ": bad size field"));
    }
    const char type = static_cast<char>(h[156]);
    if (type == 'L') {
      RETURN_IF_ERROR(ReadData(&in, size, &long_name));
      long_name = Field(long_name.data(), long_name.size());
      continue;
    }
    if (type == 'x' || type == 'g') {
      std::string data;
      RETURN_IF_ERROR(ReadData(&in, size, &data));
      if (type == 'x') RETURN_IF_ERROR(ParsePax(data, where, &long_name, &pax_size));
      continue;
    }
    if (type == 'K' || type == 'V') {  // GNU long link name, volume label
      RETURN_IF_ERROR(SkipData(&in, size));
      continue;
    }
    std::string name = Field(reinterpret_cast<const char*>(h), 100);
    const std::string magic(reinterpret_cast<const char*>(h) + 257, 6);
    const std::string prefix = Field(reinterpret_cast<const char*>(h) + 345, 155);
    if (magic == std::string("ustar\0", 6) && !prefix.empty()) name = prefix + "/" + name;
    if (!long_name.empty()) name = long_name;
    if (pax_size >= 0) size = pax_size;
    long_name.clear();
    pax_size = -1;

    const bool is_file = type == '0' || type == '\0' || type == '7';
    const bool is_dir = type == '5';
    if (!is_file && !is_dir) {
      return Status::InvalidArgument(StrCat(where, ": member '", name, "' is a ",
                                            type == '2'   ? "symbolic link"
                                            : type == '1' ? "hard link"
                                                          : "special file",
                                            "; only regular files and folders are unpacked"));
    }
    std::string rel;
    RETURN_IF_ERROR(SafeRelativePath(name, where, &rel));
    if (!options.strip_prefix.empty()) {
      std::string prefix_norm;
      RETURN_IF_ERROR(SafeRelativePath(options.strip_prefix, "strip prefix", &prefix_norm));
      if (prefix_norm.empty()) {
        // "./" or ".": every member is under it already; nothing to strip.
      } else if (rel == prefix_norm)
        rel.clear();
      else if (rel.compare(0, prefix_norm.size() + 1, prefix_norm + "/") == 0) {
        rel = rel.substr(prefix_norm.size() + 1);
      } else {
        RETURN_IF_ERROR(SkipData(&in, is_file ? size : 0));
        continue;
      }
    }
    if (is_dir) {
      if (!rel.empty()) RETURN_IF_ERROR(MakeDirs(dest_dir + "/" + rel));
      RETURN_IF_ERROR(SkipData(&in, size));
      continue;
    }
    if (rel.empty()) {
      return Status::InvalidArgument(StrCat(where, ": file member '", name, "' has no name"));
    }
    const size_t slash = rel.rfind('/');
    if (slash != std::string::npos)
      RETURN_IF_ERROR(MakeDirs(dest_dir + "/" + rel.substr(0, slash)));
    RETURN_IF_ERROR(ExtractFile(&in, size, dest_dir + "/" + rel));
    if (files != nullptr) files->push_back(UnpackedFile{rel, size});
  }
  return Status::Ok();
}

}  // namespace pstrain
