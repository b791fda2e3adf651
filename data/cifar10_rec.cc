#include "data/cifar10_rec.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "data/cifar10.h"
#include "data/image_codec.h"
#include "data/image_recordio.h"
#include "data/recordio.h"

namespace pstrain {
namespace {

constexpr int64_t kRecordBytes = 3073;

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// Writes one .rec/.idx pair from `files`; returns the record count.
StatusOr<int64_t> WritePair(const std::vector<std::string>& files, const std::string& rec,
                            const std::string& idx) {
  const RecordPartFiles parts(rec, idx);  // what a failed write left is removed
  ASSIGN_OR_RETURN(std::unique_ptr<RecordIOWriter> writer, RecordIOWriter::Create(parts.rec));
  std::vector<RecordIndexEntry> index;
  Image image;
  image.Resize(32, 32, 3);
  std::string png;
  uint64_t id = 0;
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(ExampleSet set, ReadCifar10({file}));
    for (int64_t i = 0; i < set.count(); ++i, ++id) {
      const uint8_t* chw = set.pixels.data() + i * 3072;
      for (int p = 0; p < 1024; ++p) {  // planes R, G, B -> interleaved RGB
        image.pixels[3 * p] = chw[p];
        image.pixels[3 * p + 1] = chw[1024 + p];
        image.pixels[3 * p + 2] = chw[2048 + p];
      }
      RETURN_IF_ERROR(EncodePng(image, &png));
      index.push_back(RecordIndexEntry{id, writer->Tell()});
      RETURN_IF_ERROR(writer->Write(PackImageRecord(id, {set.labels[i]}, png)));
    }
  }
  RETURN_IF_ERROR(writer->Close());
  RETURN_IF_ERROR(WriteRecordIndex(parts.idx, index));
  RETURN_IF_ERROR(CommitRecordFiles(rec, idx));
  return static_cast<int64_t>(id);
}

// The records the batch files hold, by their sizes.
int64_t CountRecords(const std::vector<std::string>& files) {
  int64_t n = 0;
  for (const std::string& f : files) n += std::max<int64_t>(0, FileSize(f)) / kRecordBytes;
  return n;
}

// True when rec and idx exist and the .idx lists `want` records.
bool PairComplete(const std::string& rec, const std::string& idx, int64_t want) {
  if (FileSize(rec) <= 0) return false;
  auto entries = ReadRecordIndex(idx);
  return entries.ok() && static_cast<int64_t>(entries->size()) == want;
}

}  // namespace

Status WriteCifar10RecordIO(const std::string& dir, const std::string& out_dir, bool force,
                            Cifar10RecStats* stats) {
  *stats = Cifar10RecStats();
  ASSIGN_OR_RETURN(std::vector<std::string> train, FindCifar10Files(dir, true));
  ASSIGN_OR_RETURN(std::vector<std::string> test, FindCifar10Files(dir, false));
  const std::string train_rec = out_dir + "/train.rec", train_idx = out_dir + "/train.idx";
  const std::string test_rec = out_dir + "/test.rec", test_idx = out_dir + "/test.idx";
  const int64_t want_train = CountRecords(train), want_test = CountRecords(test);
  const bool have_train = !force && PairComplete(train_rec, train_idx, want_train);
  const bool have_test = !force && PairComplete(test_rec, test_idx, want_test);
  stats->already_there = have_train && have_test;
  if (have_train) {
    stats->train_records = want_train;
  } else {
    ASSIGN_OR_RETURN(stats->train_records, WritePair(train, train_rec, train_idx));
  }
  if (have_test) {
    stats->test_records = want_test;
  } else {
    ASSIGN_OR_RETURN(stats->test_records, WritePair(test, test_rec, test_idx));
  }
  return Status::Ok();
}

}  // namespace pstrain
