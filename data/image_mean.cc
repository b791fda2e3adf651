#include "data/image_mean.h"

#include <cerrno>
#include <cstring>
#include <fstream>

namespace pstrain {
namespace {

constexpr uint64_t kNDArrayListMagic = 0x112;
constexpr uint32_t kNDArrayV1Magic = 0xF993FAC8;
constexpr uint32_t kNDArrayV2Magic = 0xF993FAC9;
constexpr int32_t kFloat32 = 0;  // mshadow type flag
constexpr int32_t kCpu = 1;      // Context::kCPU

// Bounds-checked little-endian reads from a byte string.
class Reader {
 public:
  Reader(const std::string& path, const std::string& bytes) : path_(path), bytes_(bytes) {}
  template <typename T>
  Status Read(T* out, const char* what) {
    if (pos_ + sizeof(T) > bytes_.size()) return Truncated(what);
    std::memcpy(out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status ReadBytes(void* out, size_t n, const char* what) {
    if (n > bytes_.size() - pos_) return Truncated(what);
    std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  Status Corrupt(const std::string& why) const {
    return Status::Corruption(StrCat(path_, ":", pos_, ": ", why));
  }
  Status SkipBytes(size_t n, const char* what) {
    if (n > bytes_.size() - pos_) return Truncated(what);
    pos_ += n;
    return Status::Ok();
  }
  size_t pos() const { return pos_; }
  size_t left() const { return bytes_.size() - pos_; }
  void Rewind(size_t n) { pos_ -= n; }

 private:
  Status Truncated(const char* what) const {
    return Status::Corruption(
        StrCat(path_, ":", pos_, ": file ends inside the ", what, " (", bytes_.size(), " bytes)"));
  }
  const std::string& path_;
  const std::string& bytes_;
  size_t pos_ = 0;
};

Status ReadArray(Reader* r, MeanImage* out, bool* is_float) {
  uint32_t magic = 0;
  RETURN_IF_ERROR(r->Read(&magic, "array magic"));
  out->shape.clear();
  uint32_t ndim = 0;
  if (magic == kNDArrayV2Magic || magic == kNDArrayV1Magic) {
    if (magic == kNDArrayV2Magic) {
      int32_t stype = 0;
      RETURN_IF_ERROR(r->Read(&stype, "storage type"));
      if (stype != 0) return r->Corrupt(StrCat("sparse array (storage type ", stype, ")"));
    }
    RETURN_IF_ERROR(r->Read(&ndim, "shape"));
    if (ndim > 8) return r->Corrupt(StrCat("array of ", ndim, " dimensions"));
    for (uint32_t i = 0; i < ndim; ++i) {
      int64_t d = 0;
      RETURN_IF_ERROR(r->Read(&d, "shape"));
      out->shape.push_back(d);
    }
  } else {  // legacy: the word just read is ndim, dims are uint32
    ndim = magic;
    if (ndim > 8) return r->Corrupt(StrCat("not an NDArray (first word ", magic, ")"));
    for (uint32_t i = 0; i < ndim; ++i) {
      uint32_t d = 0;
      RETURN_IF_ERROR(r->Read(&d, "shape"));
      out->shape.push_back(d);
    }
  }
  if (ndim == 0) {  // a "none" array has no context or data
    *is_float = false;
    return Status::Ok();
  }
  int64_t count = 1;
  for (int64_t d : out->shape) {
    if (d < 0 || d > (int64_t{1} << 31)) return r->Corrupt(StrCat("dimension ", d));
    count *= d;
    if (count > (int64_t{1} << 31)) return r->Corrupt("array too large");
  }
  int32_t dev_type = 0, dev_id = 0, type_flag = 0;
  RETURN_IF_ERROR(r->Read(&dev_type, "context"));
  RETURN_IF_ERROR(r->Read(&dev_id, "context"));
  RETURN_IF_ERROR(r->Read(&type_flag, "type flag"));
  static const int kTypeSize[] = {4, 8, 2, 1, 4, 1, 8};
  if (type_flag < 0 || type_flag > 6) return r->Corrupt(StrCat("unknown type flag ", type_flag));
  *is_float = type_flag == kFloat32;
  if (!*is_float) return r->SkipBytes(static_cast<size_t>(count) * kTypeSize[type_flag], "data");
  // The file must hold the data before it is allocated (a header of a few
  // bytes may claim 2^31 floats).
  if (static_cast<uint64_t>(count) * 4 > r->left()) {
    return r->Corrupt(StrCat("the array claims ", count, " floats but the file holds ", r->left(),
                             " more bytes"));
  }
  out->data.resize(static_cast<size_t>(count));
  return r->ReadBytes(out->data.data(), out->data.size() * 4, "data");
}

}  // namespace

StatusOr<MeanImage> LoadMeanImage(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(StrCat("cannot open mean image ", path));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Reader r(path, bytes);
  uint64_t magic = 0, reserved = 0, count = 0;
  RETURN_IF_ERROR(r.Read(&magic, "header"));
  if (magic != kNDArrayListMagic) {
    r.Rewind(8);
    return r.Corrupt(StrCat("not an NDArray list file (magic ", magic, ", expected 0x112)"));
  }
  RETURN_IF_ERROR(r.Read(&reserved, "header"));
  RETURN_IF_ERROR(r.Read(&count, "array count"));
  if (count > 1024) return r.Corrupt(StrCat(count, " arrays"));
  std::vector<MeanImage> arrays(count);
  std::vector<bool> is_float(count);
  for (uint64_t i = 0; i < count; ++i) {
    bool f = false;
    RETURN_IF_ERROR(ReadArray(&r, &arrays[i], &f));
    is_float[i] = f;
  }
  uint64_t num_names = 0;
  std::vector<std::string> names;
  if (r.pos() < bytes.size()) {
    RETURN_IF_ERROR(r.Read(&num_names, "name count"));
    if (num_names != 0 && num_names != count) {
      return r.Corrupt(StrCat(num_names, " names for ", count, " arrays"));
    }
    for (uint64_t i = 0; i < num_names; ++i) {
      uint64_t len = 0;
      RETURN_IF_ERROR(r.Read(&len, "name"));
      if (len > 4096) return r.Corrupt(StrCat("name of ", len, " bytes"));
      std::string name(len, '\0');
      RETURN_IF_ERROR(r.ReadBytes(name.data(), len, "name"));
      names.push_back(std::move(name));
    }
  }
  int pick = count == 1 ? 0 : -1;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == "mean_img") pick = static_cast<int>(i);
  }
  if (pick < 0) return Status::NotFound(StrCat(path, ": no array named mean_img"));
  if (!is_float[pick]) {
    return Status::InvalidArgument(StrCat(path, ": mean_img is not a float32 array"));
  }
  if (arrays[pick].shape.size() != 3) {
    return Status::InvalidArgument(StrCat(path, ": mean_img has ", arrays[pick].shape.size(),
                                          " dimensions, expected C x H x W"));
  }
  return std::move(arrays[pick]);
}

Status SaveMeanImage(const std::string& path, const MeanImage& mean) {
  int64_t count = 1;
  for (int64_t d : mean.shape) count *= d;
  if (mean.shape.size() != 3 || count != static_cast<int64_t>(mean.data.size())) {
    return Status::InvalidArgument(
        StrCat("mean image of ", mean.data.size(), " values does not match its shape"));
  }
  std::string out;
  auto put = [&out](const auto& v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(kNDArrayListMagic);
  put(uint64_t{0});
  put(uint64_t{1});
  put(kNDArrayV2Magic);
  put(int32_t{0});  // dense storage
  put(static_cast<uint32_t>(mean.shape.size()));
  for (int64_t d : mean.shape) put(d);
  put(kCpu);
  put(int32_t{0});
  put(kFloat32);
  out.append(reinterpret_cast<const char*>(mean.data.data()), mean.data.size() * 4);
  const std::string name = "mean_img";
  put(uint64_t{1});
  put(static_cast<uint64_t>(name.size()));
  out += name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.close();
  if (!f) return Status::IOError(StrCat("writing ", path, " failed: ", std::strerror(errno)));
  return Status::Ok();
}

}  // namespace pstrain
