// The data set readers: MNIST idx files (images and labels, raw or gzip),
// CIFAR-10 binary batches, a RecordIO index (.idx). Every input is either
// read or refused with a Status; none may crash. Input: two parts (see
// SplitParts); a part that starts with the gzip magic is read as a .gz file.
#include <cstdint>
#include <string>

#include "data/cifar10.h"
#include "data/mnist.h"
#include "data/recordio.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pstrain;
  const auto parts = fuzz::SplitParts(data, size);
  if (parts.size() < 2) return 0;
  auto gz = [](std::string_view part) {
    return part.size() >= 2 && part[0] == '\x1f' && part[1] == '\x8b';
  };
  fuzz::MemFile images(parts[0], gz(parts[0]) ? "images.gz" : "");
  fuzz::MemFile labels(parts[1], gz(parts[1]) ? "labels.gz" : "");
  (void)ReadMnist(images.path(), labels.path());
  (void)ReadCifar10({images.path()});
  (void)ReadRecordIndex(labels.path());
  return 0;
}
