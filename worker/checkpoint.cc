#include "worker/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "data/file_bytes.h"

namespace pstrain {
namespace {

constexpr char kMagic[8] = {'P', 'S', 'T', 'R', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxNdim = 8;

void PutBytes(std::vector<uint8_t>* out, const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  out->insert(out->end(), b, b + n);
}
template <typename T>
void Put(std::vector<uint8_t>* out, T v) {
  PutBytes(out, &v, sizeof(v));  // the build targets little-endian x86-64 and ARM64
}

class Reader {
 public:
  Reader(const std::string& path, const std::vector<uint8_t>& bytes, size_t end)
      : path_(path), bytes_(bytes), end_(end) {}
  template <typename T>
  Status Get(T* v, const char* what) {
    return GetBytes(v, sizeof(T), what);
  }
  Status GetBytes(void* dst, size_t n, const char* what) {
    if (end_ - pos_ < n) {
      return Status::Corruption(StrCat(path_, ": truncated at byte offset ", end_, " reading ",
                                       what, " (", n, " bytes from offset ", pos_, ")"));
    }
    std::memcpy(dst, bytes_.data() + pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  size_t pos() const { return pos_; }

 private:
  const std::string& path_;
  const std::vector<uint8_t>& bytes_;
  size_t end_;
  size_t pos_ = 0;
};

std::string EpochPath(const std::string& prefix, int epoch, const char* ext) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "-%04d.%s", epoch, ext);
  return prefix + buf;
}

}  // namespace

std::string CheckpointParamsPath(const std::string& prefix, int epoch) {
  return EpochPath(prefix, epoch, "params");
}
std::string CheckpointStatesPath(const std::string& prefix, int epoch) {
  return EpochPath(prefix, epoch, "states");
}

Status SaveArrays(const std::string& path, const std::vector<NamedArray>& arrays) {
  std::vector<uint8_t> out;
  PutBytes(&out, kMagic, sizeof(kMagic));
  Put<uint32_t>(&out, kVersion);
  Put<uint32_t>(&out, static_cast<uint32_t>(arrays.size()));
  for (const NamedArray& a : arrays) {
    int64_t n = 1;
    for (int64_t d : a.shape) n *= d;
    CHECK_EQ(n, static_cast<int64_t>(a.data.size())) << a.name;
    Put<uint32_t>(&out, static_cast<uint32_t>(a.kind));
    Put<uint32_t>(&out, static_cast<uint32_t>(a.name.size()));
    PutBytes(&out, a.name.data(), a.name.size());
    Put<uint32_t>(&out, static_cast<uint32_t>(a.shape.size()));
    for (int64_t d : a.shape) Put<int64_t>(&out, d);
    PutBytes(&out, a.data.data(), a.data.size() * sizeof(float));
  }
  // crc32_z takes a size_t: all of a file past 4 GiB, not its size mod 2^32.
  Put<uint32_t>(&out, static_cast<uint32_t>(crc32_z(0L, out.data(), out.size())));

  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return Status::IOError(StrCat("cannot write checkpoint ", tmp, ": ", std::strerror(errno)));
  }
  bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  ok = ok && std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status::IOError(StrCat("cannot write checkpoint ", path, ": ", std::strerror(errno)));
  }
  // The rename itself survives a power loss once the folder is synced.
  const std::string folder = std::filesystem::path(path).parent_path().string();
  const int dir = open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)fsync(dir);
    close(dir);
  }
  return Status::Ok();
}

StatusOr<std::vector<NamedArray>> LoadArrays(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  if (bytes.size() < sizeof(kMagic) + 12) {
    return Status::Corruption(StrCat(path, ": truncated at byte offset ", bytes.size(),
                                     ": too short for a checkpoint header"));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return Status::Corruption(
        StrCat(path, ": bad magic at byte offset 0: not a pstrain checkpoint"));
  }
  const size_t body = bytes.size() - 4;
  uint32_t stored_crc = 0;
  std::memcpy(&stored_crc, bytes.data() + body, 4);
  Reader r(path, bytes, body);
  char magic[8];
  RETURN_IF_ERROR(r.GetBytes(magic, sizeof(magic), "magic"));
  uint32_t version = 0, count = 0;
  RETURN_IF_ERROR(r.Get(&version, "version"));
  if (version != kVersion) {
    return Status::Corruption(
        StrCat(path, ": version ", version, " at byte offset 8 (expected ", kVersion, ")"));
  }
  RETURN_IF_ERROR(r.Get(&count, "array count"));
  std::vector<NamedArray> arrays;
  for (uint32_t i = 0; i < count; ++i) {
    NamedArray a;
    const size_t start = r.pos();
    uint32_t kind = 0, name_len = 0, ndim = 0;
    RETURN_IF_ERROR(r.Get(&kind, "array kind"));
    if (kind > 2) {
      return Status::Corruption(
          StrCat(path, ": array ", i, " at byte offset ", start, " has unknown kind ", kind));
    }
    a.kind = static_cast<NamedArray::Kind>(kind);
    RETURN_IF_ERROR(r.Get(&name_len, "name length"));
    if (name_len > body) {
      return Status::Corruption(StrCat(path, ": array ", i, " at byte offset ", start,
                                       ": name length ", name_len, " exceeds the file"));
    }
    a.name.resize(name_len);
    RETURN_IF_ERROR(r.GetBytes(a.name.data(), name_len, "name"));
    RETURN_IF_ERROR(r.Get(&ndim, "ndim"));
    if (ndim > kMaxNdim) {
      return Status::Corruption(StrCat(path, ": array ", a.name, " at byte offset ", start,
                                       ": ndim ", ndim, " > ", kMaxNdim));
    }
    int64_t n = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      int64_t dim = 0;
      RETURN_IF_ERROR(r.Get(&dim, "dimension"));
      if (dim < 0 || (dim > 0 && n > static_cast<int64_t>(body) / dim)) {
        return Status::Corruption(StrCat(path, ": array ", a.name, " at byte offset ", start,
                                         ": dimension ", dim, " does not fit the file"));
      }
      a.shape.push_back(dim);
      n *= dim;
    }
    a.data.resize(n);
    RETURN_IF_ERROR(r.GetBytes(a.data.data(), n * sizeof(float), "array data"));
    arrays.push_back(std::move(a));
  }
  if (r.pos() != body) {
    return Status::Corruption(
        StrCat(path, ": ", body - r.pos(), " unexpected bytes at byte offset ", r.pos()));
  }
  uint32_t crc = static_cast<uint32_t>(crc32_z(0L, bytes.data(), body));
  if (crc != stored_crc && body > UINT32_MAX) {
    // Written before the CRC covered all of a file past 4 GiB: its size mod 2^32.
    crc = static_cast<uint32_t>(crc32(0L, bytes.data(), static_cast<uInt>(body)));
  }
  if (crc != stored_crc) {
    return Status::Corruption(
        StrCat(path, ": CRC mismatch at byte offset ", body, " (the file is damaged)"));
  }
  return arrays;
}

}  // namespace pstrain
