// RecordIO: dmlc-core's record container, byte for byte
// (../shared/reference/mxnet_facts.md 3.4).
//
// A physical record is the little-endian words `magic` (0xCED7230A) and
// `lrec = cflag << 29 | length`, then `length` payload bytes, then zero padding
// to a multiple of 4. A payload that contains the magic at a 4-byte-aligned
// offset is cut there into pieces (cflag 1 first, 2 middle, 3 last; 0 for a
// whole record) and the magic word itself is dropped; the reader puts it back.
// Because every aligned magic word in a file therefore starts a record, a file
// can be split into byte ranges that start at records (PartitionRange).
//
// `.idx` files are text, one "key\tbyte_offset\n" per record.
#ifndef PSTRAIN_DATA_RECORDIO_H_
#define PSTRAIN_DATA_RECORDIO_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace pstrain {

inline constexpr uint32_t kRecordIOMagic = 0xCED7230A;
// Largest payload piece a lrec word can describe.
inline constexpr uint32_t kRecordIOMaxLength = (1u << 29) - 1;

inline uint32_t RecordIOEncodeLRec(uint32_t cflag, uint32_t length) {
  return (cflag << 29) | length;
}
inline uint32_t RecordIODecodeFlag(uint32_t lrec) { return lrec >> 29; }
inline uint32_t RecordIODecodeLength(uint32_t lrec) { return lrec & kRecordIOMaxLength; }

// Appends records to a file. Not thread-safe; one writer per file.
class RecordIOWriter {
 public:
  // Creates (truncates) `path`.
  static StatusOr<std::unique_ptr<RecordIOWriter>> Create(const std::string& path);
  ~RecordIOWriter();
  RecordIOWriter(const RecordIOWriter&) = delete;
  RecordIOWriter& operator=(const RecordIOWriter&) = delete;

  // Appends one record (split into pieces if it contains an aligned magic word).
  // The record's start offset, for a .idx file, is Tell() before the call.
  // A payload of 2^29 bytes or more is InvalidArgument.
  Status Write(std::string_view record);
  // Byte offset where the next record starts.
  uint64_t Tell() const { return offset_; }
  // Number of magic words escaped so far (dmlc's except_counter).
  int64_t num_escaped() const { return num_escaped_; }
  // Flushes and closes; reports write errors. Called by the destructor if needed.
  Status Close();

 private:
  RecordIOWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  Status WriteBytes(const void* data, size_t size);

  std::string path_;
  std::FILE* file_;
  uint64_t offset_ = 0;
  int64_t num_escaped_ = 0;
};

// A read-only view of a whole RecordIO file (memory-mapped). All methods are
// const and thread-safe: many threads may read records at once. A record made
// of one piece is returned as a view into the mapping (no copy).
class RecordIOFile {
 public:
  static StatusOr<std::unique_ptr<RecordIOFile>> Open(const std::string& path);
  ~RecordIOFile();
  RecordIOFile(const RecordIOFile&) = delete;
  RecordIOFile& operator=(const RecordIOFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }

  // Tells the kernel the file will be read once from start to end (larger
  // read-ahead, pages dropped sooner), for tools that stream a whole file.
  void AdviseSequential() const;
  // Unmaps from this process the pages from the one holding byte `begin` up to,
  // not including, the one holding byte `end` (they stay in the page cache; a
  // later read maps them again), so that streaming a file larger than memory
  // keeps the process small. Consecutive ranges release every page once.
  // REQUIRES: no view into those pages is in use.
  void ReleaseRange(uint64_t begin, uint64_t end) const;

  // Reads the record starting at `offset`. On success *record views the
  // payload: into the mapping for a one-piece record, else into *scratch (which
  // must outlive the use of *record). *next_offset (if not null) receives the
  // offset just past the record. A bad magic, a bad continuation flag or a
  // truncated record is Corruption naming the file and byte offset.
  Status ReadAt(uint64_t offset, std::string_view* record, std::string* scratch,
                uint64_t* next_offset) const;

  // The start offsets of all records that begin in [begin, end), in file
  // order, found by hopping over the lrec words (payloads are not copied).
  // REQUIRES: begin is a record start (as PartitionRange returns).
  StatusOr<std::vector<uint64_t>> ScanRecordStarts(uint64_t begin, uint64_t end) const;
  // How many records begin in [begin, end) (the same hops, nothing kept).
  // REQUIRES: begin is a record start.
  StatusOr<uint64_t> CountRecords(uint64_t begin, uint64_t end) const;

  // The first record start at or after `pos` (pos rounded up to 4): the next
  // aligned magic word followed by a cflag of 0 or 1, as dmlc's
  // RecordIOSplitter::SeekRecordBegin finds it; size() if there is none.
  uint64_t SeekRecordBegin(uint64_t pos) const;

  // The byte range [begin, end) of part `part_index` of `num_parts`, as MXNet
  // splits a file among workers: ceil(size / num_parts) rounded up to 4 bytes
  // per part, each boundary moved forward to the next record start. Every
  // record starts in exactly one part. REQUIRES: 0 <= part_index < num_parts.
  std::pair<uint64_t, uint64_t> PartitionRange(int part_index, int num_parts) const;

 private:
  RecordIOFile(std::string path, const uint8_t* data, uint64_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  uint32_t WordAt(uint64_t offset) const;

  std::string path_;
  const uint8_t* data_;  // the mapping (null for an empty file)
  uint64_t size_;
};

// One line of a .idx file.
struct RecordIndexEntry {
  uint64_t key = 0;
  uint64_t offset = 0;
};

// Reads a .idx file; a malformed line is InvalidArgument naming file:line.
StatusOr<std::vector<RecordIndexEntry>> ReadRecordIndex(const std::string& path);
// Writes a .idx file ("key\toffset\n" per entry).
Status WriteRecordIndex(const std::string& path, const std::vector<RecordIndexEntry>& entries);

// A .rec/.idx pair is written as `rec`.part and `idx`.part, then put in place
// here: the old .idx goes first, then each part file takes its name. An
// interruption at any point never leaves a .rec beside an .idx of other
// records (a .rec alone is scanned), and a reader that has the old .rec
// mapped keeps reading it (it is replaced, not truncated).
Status CommitRecordFiles(const std::string& rec, const std::string& idx);

// The part files of a .rec/.idx pair being written (`rec`.part, `idx`.part),
// removed when it goes: after CommitRecordFiles they are gone already, after
// an error what was written is not left beside. Declare it before the writer,
// so that the writer closes first.
struct RecordPartFiles {
  RecordPartFiles(const std::string& rec_path, const std::string& idx_path)
      : rec(rec_path + ".part"), idx(idx_path + ".part") {}
  ~RecordPartFiles() {
    std::remove(rec.c_str());
    std::remove(idx.c_str());
  }
  RecordPartFiles(const RecordPartFiles&) = delete;
  RecordPartFiles& operator=(const RecordPartFiles&) = delete;
  const std::string rec, idx;
};

}  // namespace pstrain

#endif  // PSTRAIN_DATA_RECORDIO_H_
