// A RecordIO file (.rec) as the image pipeline reads it: every record found
// by scanning and by partitioning, each parsed as an image record; and as
// `pstrain rec check` reads it: every record decoded on two threads, the
// summary counted.
#include <cstdint>
#include <string>

#include "data/image_recordio.h"
#include "data/rec_tools.h"
#include "data/recordio.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pstrain;
  fuzz::MemFile file(std::string_view(reinterpret_cast<const char*>(data), size));
  auto rec = RecordIOFile::Open(file.path());
  if (!rec.ok()) return 0;
  for (int parts : {1, 3}) {
    for (int p = 0; p < parts; ++p) {
      const auto [begin, end] = (*rec)->PartitionRange(p, parts);
      auto starts = (*rec)->ScanRecordStarts(begin, end);
      if (!starts.ok()) continue;
      for (uint64_t offset : *starts) {
        std::string_view record;
        std::string scratch;
        if (!(*rec)->ReadAt(offset, &record, &scratch, nullptr).ok()) continue;
        ImageRecordView view;
        (void)ParseImageRecord(record, "fuzz", &view);
      }
    }
  }
  (void)(*rec)->SeekRecordBegin(size / 2);

  ScanOptions scan;
  scan.num_threads = 2;
  scan.label_width = size % 3;
  RecordFileSummary summary(size);
  (void)ScanImageRecords(**rec, scan, [&](const ScannedRecord& r) {
    summary.Add(r);
    return Status::Ok();
  });
  (void)summary.ToString();
  return 0;
}
