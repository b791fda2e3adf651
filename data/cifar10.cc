#include "data/cifar10.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "data/file_bytes.h"

namespace pstrain {
namespace {

constexpr int64_t kImageBytes = 3 * 32 * 32;
constexpr int64_t kRecordBytes = 1 + kImageBytes;

bool Matches(const std::string& name, const std::string& prefix) {
  return name.compare(0, prefix.size(), prefix) == 0 && name.size() >= 4 &&
         name.compare(name.size() - 4, 4, ".bin") == 0;
}

}  // namespace

StatusOr<ExampleSet> ReadCifar10(const std::vector<std::string>& files) {
  ExampleSet set;
  set.shape = {3, 32, 32};
  for (const std::string& path : files) {
    ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
    const int64_t size = static_cast<int64_t>(bytes.size());
    if (size % kRecordBytes != 0) {
      return Status::Corruption(StrCat(
          path, ": truncated record at byte offset ", size / kRecordBytes * kRecordBytes,
          ": file has ", size, " bytes, not a multiple of the ", kRecordBytes, "-byte record"));
    }
    const int64_t n = size / kRecordBytes;
    const size_t base = set.pixels.size();
    set.pixels.resize(base + n * kImageBytes);
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* rec = bytes.data() + i * kRecordBytes;
      if (rec[0] >= 10) {
        return Status::Corruption(StrCat(path, ": label ", int{rec[0]}, " at byte offset ",
                                         i * kRecordBytes, " is not a class 0-9"));
      }
      set.labels.push_back(rec[0]);
      std::copy(rec + 1, rec + kRecordBytes, set.pixels.begin() + base + i * kImageBytes);
    }
  }
  return set;
}

StatusOr<std::vector<std::string>> FindCifar10Files(const std::string& dir, bool train) {
  const std::string prefix = train ? "data_batch_" : "test_batch";
  std::vector<std::string> files;
  std::error_code ec;
  // The non-throwing calls: an entry whose type cannot be read (a link loop,
  // a link into a folder without permission) is passed over, not an exception.
  std::filesystem::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    std::string name = it->path().filename().string();
    if (Matches(name, prefix)) files.push_back(it->path().string());
  }
  if (ec) return Status::IOError(StrCat(dir, ": cannot list: ", ec.message()));
  if (files.empty()) {
    return Status::NotFound(StrCat("no CIFAR-10 ", prefix, "*.bin files in ", dir));
  }
  std::sort(files.begin(), files.end());
  return files;
}

StatusOr<std::unique_ptr<DataIter>> NewCifar10Iter(const std::string& dir, bool train,
                                                   const IterOptions& opts) {
  ASSIGN_OR_RETURN(std::vector<std::string> files, FindCifar10Files(dir, train));
  ASSIGN_OR_RETURN(ExampleSet set, ReadCifar10(files));
  return NewInMemoryIter(std::make_shared<const ExampleSet>(std::move(set)), opts,
                         train ? "CIFAR-10 train" : "CIFAR-10 validation");
}

}  // namespace pstrain
