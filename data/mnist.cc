#include "data/mnist.h"

#include <utility>
#include <vector>

#include "data/file_bytes.h"

namespace pstrain {
namespace {

constexpr uint32_t kImagesMagic = 2051;
constexpr uint32_t kLabelsMagic = 2049;
constexpr int kNumClasses = 10;

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Checks that `bytes` holds `words` header words and returns them.
StatusOr<std::vector<uint32_t>> ReadHeader(const std::string& path,
                                           const std::vector<uint8_t>& bytes, int words,
                                           uint32_t magic) {
  if (bytes.size() < static_cast<size_t>(words) * 4) {
    return Status::Corruption(StrCat(path, ": truncated header at byte offset ", bytes.size(),
                                     ": expected ", words * 4, " header bytes"));
  }
  std::vector<uint32_t> header(words);
  for (int i = 0; i < words; ++i) header[i] = BigEndian32(bytes.data() + 4 * i);
  if (header[0] != magic) {
    return Status::Corruption(
        StrCat(path, ": bad magic at byte offset 0: expected ", magic, ", got ", header[0]));
  }
  return header;
}

}  // namespace

StatusOr<ExampleSet> ReadMnist(const std::string& images_path, const std::string& labels_path) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> images, ReadFileBytes(images_path));
  ASSIGN_OR_RETURN(std::vector<uint32_t> ih, ReadHeader(images_path, images, 4, kImagesMagic));
  const uint64_t count = ih[1], rows = ih[2], cols = ih[3];
  if (rows == 0 || cols == 0 || rows > 65536 || cols > 65536) {
    return Status::Corruption(
        StrCat(images_path, ": implausible image size ", rows, "x", cols, " at byte offset 8"));
  }
  const uint64_t want = 16 + count * rows * cols;
  if (images.size() != want) {
    return Status::Corruption(StrCat(
        images_path,
        images.size() < want ? ": truncated at byte offset " : ": trailing bytes at byte offset ",
        images.size() < want ? images.size() : want, ": header says ", count, " images of ", rows,
        "x", cols, " (", want, " bytes), file has ", images.size(), " bytes"));
  }
  ASSIGN_OR_RETURN(std::vector<uint8_t> labels, ReadFileBytes(labels_path));
  ASSIGN_OR_RETURN(std::vector<uint32_t> lh, ReadHeader(labels_path, labels, 2, kLabelsMagic));
  if (lh[1] != count) {
    return Status::Corruption(StrCat(labels_path, ": label count ", lh[1],
                                     " at byte offset 4 does not match ", count, " images in ",
                                     images_path));
  }
  if (labels.size() != 8 + count) {
    return Status::Corruption(StrCat(labels_path,
                                     labels.size() < 8 + count ? ": truncated at byte offset "
                                                               : ": trailing bytes at byte offset ",
                                     std::min<uint64_t>(labels.size(), 8 + count), ": header says ",
                                     count, " labels, file has ", labels.size(), " bytes"));
  }
  ExampleSet set;
  set.shape = {1, static_cast<int64_t>(rows), static_cast<int64_t>(cols)};
  set.labels.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    uint8_t l = labels[8 + i];
    if (l >= kNumClasses) {
      return Status::Corruption(StrCat(labels_path, ": label ", int{l}, " at byte offset ", 8 + i,
                                       " is not a digit 0-9"));
    }
    set.labels[i] = l;
  }
  images.erase(images.begin(), images.begin() + 16);
  set.pixels = std::move(images);
  return set;
}

StatusOr<std::string> FindMnistFile(const std::string& dir, const std::string& name) {
  std::string base = dir.empty() ? name : dir + "/" + name;
  if (FileExists(base)) return base;
  if (FileExists(base + ".gz")) return base + ".gz";
  return Status::NotFound(StrCat("MNIST file ", base, " (or ", base, ".gz) not found"));
}

StatusOr<std::unique_ptr<DataIter>> NewMnistIter(const std::string& dir, bool train,
                                                 const IterOptions& opts) {
  const std::string prefix = train ? "train" : "t10k";
  ASSIGN_OR_RETURN(std::string images, FindMnistFile(dir, prefix + "-images-idx3-ubyte"));
  ASSIGN_OR_RETURN(std::string labels, FindMnistFile(dir, prefix + "-labels-idx1-ubyte"));
  ASSIGN_OR_RETURN(ExampleSet set, ReadMnist(images, labels));
  return NewInMemoryIter(std::make_shared<const ExampleSet>(std::move(set)), opts,
                         train ? "MNIST train" : "MNIST validation");
}

}  // namespace pstrain
