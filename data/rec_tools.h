// Whole-file tools over RecordIO image files: the library behind
// `pstrain rec ls|unpack|index|check` (tools/rec_cmd.cc). Everything reads the
// file through RecordIOFile (recordio.h) and ParseImageRecord
// (image_recordio.h), streaming it from start to end.
//
// A damaged stretch of a file (bad magic, bad continuation flag, a length that
// runs past the end) is reported as one bad record at the byte where it
// starts; the scan goes on at the next record start after it
// (RecordIOFile::SeekRecordBegin), so the records behind it keep their
// positions.
#ifndef PSTRAIN_DATA_REC_TOOLS_H_
#define PSTRAIN_DATA_REC_TOOLS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "common/status.h"
#include "data/image_codec.h"
#include "data/image_recordio.h"
#include "data/recordio.h"

namespace pstrain {

// How far ScanImageRecords looks into each record; each level includes the ones above.
enum class RecordScanDepth {
  kFraming,      // RecordIO pieces only: offset, end, pieces
  kHeader,       // the image record header and labels
  kImageHeader,  // the image's format, size and channels, from its header
  kDecode,       // the decoded image: every pixel, channel means
};

// What is wrong with a record.
enum class RecordProblem {
  kNone,
  kFraming,     // bad magic, bad continuation flag, truncated header or payload
  kHeader,      // payload shorter than the 24-byte header plus its labels
  kLabelCount,  // not the expected number of labels (ScanOptions::label_width)
  kImage,       // not a JPEG/PNG, or it does not decode
};
// "framing", "header", "label count", "image".
const char* RecordProblemName(RecordProblem problem);

struct ScanOptions {
  RecordScanDepth depth = RecordScanDepth::kDecode;
  // Threads that read image headers or decode (kImageHeader, kDecode); records
  // still reach the callback in file order.
  int num_threads = 1;
  // > 0: a record with another number of labels is bad (kLabelCount).
  int label_width = 0;
};

// One record as ScanImageRecords hands it to the callback. The views point into
// the file's mapping or the scan's buffers: valid only during the callback.
struct ScannedRecord {
  int64_t index = 0;    // position in the file, from 0; a damaged stretch counts as one
  uint64_t offset = 0;  // byte offset of the record's first piece
  uint64_t end = 0;     // byte offset just past the record (or the damaged stretch)
  int pieces = 0;       // RecordIO pieces (1: whole; 3: cflag 1, 2, 3); 0 when damaged
  std::string_view payload;
  ImageRecordView record;             // depth >= kHeader
  ImageInfo image;                    // depth >= kImageHeader
  std::vector<double> channel_means;  // depth == kDecode: image.channels values in [0, 255]
  RecordProblem problem = RecordProblem::kNone;
  Status status;  // what is wrong (naming the file and byte offset), or Ok

  bool ok() const { return problem == RecordProblem::kNone; }
};

using RecordCallback = std::function<Status(const ScannedRecord&)>;

// Reads every record of `file` in order and calls `fn` for each, good or bad.
// Returns the first non-Ok status of `fn` (the scan stops there), else Ok: bad
// records are reported to `fn`, not returned. Pages already scanned are
// released (RecordIOFile::ReleaseRange), so the process stays small on any
// file size; no view into `file` may be held across the call.
// REQUIRES: options.num_threads >= 1.
Status ScanImageRecords(const RecordIOFile& file, const ScanOptions& options,
                        const RecordCallback& fn);

// Counts and distributions over the records of a file (`rec check`).
class RecordFileSummary {
 public:
  // Distinct label values and image sizes kept (the rest are only counted).
  static constexpr size_t kMaxDistinct = 1000;

  explicit RecordFileSummary(uint64_t file_bytes) : file_bytes_(file_bytes) {}
  // Adds one record as scanned (bad ones are counted by problem).
  void Add(const ScannedRecord& r);

  int64_t records() const { return records_; }
  int64_t bad() const { return bad_; }
  int64_t split_records() const { return split_records_; }
  // labels per record -> records
  const std::map<size_t, int64_t>& label_counts() const { return label_counts_; }
  // label value -> records holding it (at most kMaxDistinct values; NaN is
  // counted in nan_labels() instead)
  const std::map<float, int64_t>& label_values() const { return label_values_; }
  int64_t nan_labels() const { return nan_labels_; }
  // (width, height, channels) -> records (at most kMaxDistinct sizes)
  const std::map<std::tuple<int, int, int>, int64_t>& image_sizes() const { return image_sizes_; }

  // Several lines ending in '\n': records, bytes, formats, labels, image sizes,
  // problems by kind.
  std::string ToString() const;

 private:
  uint64_t file_bytes_;
  int64_t records_ = 0;
  int64_t bad_ = 0;
  int64_t split_records_ = 0;
  uint64_t payload_bytes_ = 0;
  uint64_t image_bytes_ = 0;
  std::map<RecordProblem, int64_t> problems_;
  std::map<ImageFormat, int64_t> formats_;
  std::map<size_t, int64_t> label_counts_;
  std::map<float, int64_t> label_values_;
  bool more_label_values_ = false;
  float label_min_ = 0, label_max_ = 0;
  int64_t labelled_ = 0;    // labels seen
  int64_t nan_labels_ = 0;  // of which NaN
  std::map<std::tuple<int, int, int>, int64_t> image_sizes_;
  bool more_image_sizes_ = false;
  int min_width_ = 0, max_width_ = 0, min_height_ = 0, max_height_ = 0;
  int64_t sized_ = 0;
};

// Where a readable record starts, for comparing a .idx with the file.
struct RecordStart {
  uint64_t offset = 0;
  uint64_t id = 0;
  int64_t index = 0;
};

// Compares the entries of the .idx at `idx_path` with the records of the file
// (`starts`, in file order). An entry must point at a record start and its key
// must be that record's id (what im2rec writes) or its position (what MXNet's
// rec2idx writes); every record must be listed. Returns one line per problem,
// at most `max_problems` of them plus a line that counts the rest; empty when
// the index matches.
std::vector<std::string> CompareRecordIndex(const std::string& idx_path,
                                            const std::vector<RecordIndexEntry>& entries,
                                            const std::vector<RecordStart>& starts,
                                            size_t max_problems = 20);

// The key of a .idx line.
enum class IndexKey {
  kId,        // the record header's id: what im2rec (ours and MXNet's) writes
  kPosition,  // the record's position in the file: what MXNet's tools/rec2idx.py writes
};

// The .idx of `file` (one entry per record, in file order). Any bad record is
// Corruption naming its position and byte offset: an index that skips a record
// would hide the damage.
StatusOr<std::vector<RecordIndexEntry>> BuildRecordIndex(const RecordIOFile& file, IndexKey key);

struct UnpackOptions {
  bool force = false;  // write into a folder that already holds files, replacing them
};

struct UnpackStats {
  int64_t written = 0;
  int64_t bad = 0;  // damaged records, skipped
  // Records that `pstrain im2rec --pass-through --pack-label` cannot rebuild
  // byte for byte: one label stored as a list (flag 1), a header label beside
  // a label list, or a non-zero id2.
  int64_t not_repackable = 0;
  std::string list_path;
};

// Writes the image of every readable record, bytes unchanged, to
// dir/<id>.jpg|.png|.bin (by its signature; a repeated id gets
// <id>_<position>), and dir/<stem>.lst (stem: the .rec's name without .rec)
// with "id\tlabel...\tfile" per record in file order, labels written so that
// they read back to the same floats. `pstrain im2rec --pass-through
// --pack-label dir/<stem> dir` packs them again into the same records. Damaged
// records are skipped, passed to `on_bad` and counted; an existing non-empty
// `dir` is FailedPrecondition unless options.force.
Status UnpackRecordFile(const RecordIOFile& file, const std::string& dir,
                        const UnpackOptions& options,
                        const std::function<void(const ScannedRecord&)>& on_bad,
                        UnpackStats* stats);

// A label as `rec ls` prints it: the shortest "%.Ng" that reads back to the
// same float ("3", "0.25", "-1.80735296e+09").
std::string FormatLabel(float label);
// A label as a .lst holds it: im2rec.py's "%f" when that reads back to the
// same float, else FormatLabel.
std::string FormatListLabel(float label);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_REC_TOOLS_H_
