#include "data/recordio.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

namespace pstrain {
namespace {

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

uint32_t AlignUp4(uint32_t n) { return (n + 3u) & ~3u; }

}  // namespace

// ---- writer ----

StatusOr<std::unique_ptr<RecordIOWriter>> RecordIOWriter::Create(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return Status::IOError(StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
  return std::unique_ptr<RecordIOWriter>(new RecordIOWriter(path, f));
}

RecordIOWriter::~RecordIOWriter() {
  if (file_ != nullptr) {
    Status s = Close();
    if (!s.ok()) LOG(ERROR) << s;
  }
}

Status RecordIOWriter::WriteBytes(const void* data, size_t size) {
  if (size == 0) return Status::Ok();
  if (std::fwrite(data, 1, size, file_) != size) {
    return Status::IOError(
        StrCat("write to ", path_, " at byte ", offset_, " failed: ", std::strerror(errno)));
  }
  offset_ += size;
  return Status::Ok();
}

Status RecordIOWriter::Write(std::string_view record) {
  if (file_ == nullptr) return Status::FailedPrecondition(StrCat(path_, " is closed"));
  if (record.size() > kRecordIOMaxLength) {
    return Status::InvalidArgument(StrCat("record of ", record.size(), " bytes for ", path_,
                                          " exceeds the RecordIO limit of ", kRecordIOMaxLength));
  }
  const uint32_t len = static_cast<uint32_t>(record.size());
  const uint32_t lower_align = len & ~3u;
  const char* head = record.data();
  uint32_t piece_start = 0;
  uint32_t header[2];
  header[0] = kRecordIOMagic;
  for (uint32_t i = 0; i < lower_align; i += 4) {
    uint32_t word;
    std::memcpy(&word, head + i, 4);
    if (word != kRecordIOMagic) continue;
    header[1] = RecordIOEncodeLRec(piece_start == 0 ? 1u : 2u, i - piece_start);
    RETURN_IF_ERROR(WriteBytes(header, sizeof(header)));
    RETURN_IF_ERROR(WriteBytes(head + piece_start, i - piece_start));
    piece_start = i + 4;
    ++num_escaped_;
  }
  header[1] = RecordIOEncodeLRec(piece_start != 0 ? 3u : 0u, len - piece_start);
  RETURN_IF_ERROR(WriteBytes(header, sizeof(header)));
  RETURN_IF_ERROR(WriteBytes(head + piece_start, len - piece_start));
  static const char kZeros[4] = {0, 0, 0, 0};
  return WriteBytes(kZeros, AlignUp4(len) - len);
}

Status RecordIOWriter::Close() {
  if (file_ == nullptr) return Status::Ok();
  int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) {
    return Status::IOError(StrCat("closing ", path_, " failed: ", std::strerror(errno)));
  }
  return Status::Ok();
}

// ---- reader ----

StatusOr<std::unique_ptr<RecordIOFile>> RecordIOFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(StrCat("no RecordIO file ", path));
    return Status::IOError(StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::IOError(StrCat("cannot stat ", path, ": ", std::strerror(err)));
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return Status::IOError(StrCat("cannot map ", path, ": ", std::strerror(err)));
    }
    // No MADV_WILLNEED: an ImageNet .rec is larger than memory; the kernel's
    // read-around serves both a part's sequential scan and shuffled reads.
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid
  return std::unique_ptr<RecordIOFile>(new RecordIOFile(path, data, size));
}

RecordIOFile::~RecordIOFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void RecordIOFile::AdviseSequential() const {
  if (data_ == nullptr) return;
  // Only a hint: a kernel that ignores it still reads the file correctly.
  (void)::madvise(const_cast<uint8_t*>(data_), size_, MADV_SEQUENTIAL);
}

void RecordIOFile::ReleaseRange(uint64_t begin, uint64_t end) const {
  if (data_ == nullptr) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  begin = begin / page * page;
  end = std::min(end, size_) / page * page;
  if (begin >= end) return;
  // A private read-only mapping: dropping pages loses nothing.
  (void)::madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_DONTNEED);
}

uint32_t RecordIOFile::WordAt(uint64_t offset) const {
  uint32_t w;
  std::memcpy(&w, data_ + offset, 4);
  return w;
}

Status RecordIOFile::ReadAt(uint64_t offset, std::string_view* record, std::string* scratch,
                            uint64_t* next_offset) const {
  if (offset % 4 != 0) {
    return Status::InvalidArgument(
        StrCat(path_, ": record offset ", offset, " is not a multiple of 4"));
  }
  uint64_t pos = offset;
  bool first = true;
  if (scratch != nullptr) scratch->clear();
  while (true) {
    if (pos + 8 > size_) {
      return Status::Corruption(StrCat(path_, ":", pos, ": truncated record header (file has ",
                                       size_, " bytes) in the record at byte ", offset));
    }
    uint32_t magic = WordAt(pos);
    if (magic != kRecordIOMagic) {
      return Status::Corruption(StrCat(path_, ":", pos, ": bad RecordIO magic ", Hex(magic),
                                       " (expected ", Hex(kRecordIOMagic), ")"));
    }
    uint32_t lrec = WordAt(pos + 4);
    uint32_t cflag = RecordIODecodeFlag(lrec);
    uint32_t len = RecordIODecodeLength(lrec);
    bool flag_ok = first ? (cflag == 0 || cflag == 1) : (cflag == 2 || cflag == 3);
    if (!flag_ok) {
      return Status::Corruption(StrCat(path_, ":", pos, ": unexpected continuation flag ", cflag,
                                       first ? " at a record start" : " inside a record",
                                       " (record at byte ", offset, ")"));
    }
    uint64_t payload = pos + 8;
    if (payload + AlignUp4(len) > size_) {
      return Status::Corruption(StrCat(path_, ":", pos, ": truncated record: ", len,
                                       " payload bytes announced, ", size_ - payload,
                                       " left in the file"));
    }
    const char* bytes = reinterpret_cast<const char*>(data_ + payload);
    pos = payload + AlignUp4(len);
    if (cflag == 0) {
      if (record != nullptr) *record = std::string_view(bytes, len);
      break;
    }
    if (scratch != nullptr) {
      if (!first) {
        const uint32_t magic_word = kRecordIOMagic;
        scratch->append(reinterpret_cast<const char*>(&magic_word), 4);
      }
      scratch->append(bytes, len);
    }
    first = false;
    if (cflag == 3) {
      if (record != nullptr) {
        CHECK(scratch != nullptr) << "a multi-piece record needs scratch space";
        *record = *scratch;
      }
      break;
    }
  }
  if (next_offset != nullptr) *next_offset = pos;
  return Status::Ok();
}

StatusOr<std::vector<uint64_t>> RecordIOFile::ScanRecordStarts(uint64_t begin, uint64_t end) const {
  std::vector<uint64_t> starts;
  end = std::min(end, size_);
  uint64_t pos = begin;
  while (pos < end) {
    uint64_t next = 0;
    RETURN_IF_ERROR(ReadAt(pos, nullptr, nullptr, &next));
    starts.push_back(pos);
    pos = next;
  }
  return starts;
}

StatusOr<uint64_t> RecordIOFile::CountRecords(uint64_t begin, uint64_t end) const {
  uint64_t count = 0;
  end = std::min(end, size_);
  for (uint64_t pos = begin; pos < end; ++count) {
    uint64_t next = 0;
    RETURN_IF_ERROR(ReadAt(pos, nullptr, nullptr, &next));
    pos = next;
  }
  return count;
}

uint64_t RecordIOFile::SeekRecordBegin(uint64_t pos) const {
  pos = (pos + 3) & ~uint64_t{3};
  for (; pos + 8 <= size_; pos += 4) {
    if (WordAt(pos) != kRecordIOMagic) continue;
    uint32_t cflag = RecordIODecodeFlag(WordAt(pos + 4));
    if (cflag == 0 || cflag == 1) return pos;
  }
  return size_;
}

std::pair<uint64_t, uint64_t> RecordIOFile::PartitionRange(int part_index, int num_parts) const {
  CHECK(num_parts > 0 && part_index >= 0 && part_index < num_parts)
      << "part " << part_index << " of " << num_parts;
  uint64_t step = (size_ + num_parts - 1) / num_parts;
  step = (step + 3) & ~uint64_t{3};
  uint64_t begin = std::min(step * part_index, size_);
  uint64_t end = std::min(step * (part_index + 1), size_);
  if (begin != 0) begin = SeekRecordBegin(begin);
  if (end != size_) end = SeekRecordBegin(end);
  return {begin, std::max(begin, end)};
}

// ---- .idx ----

namespace {
bool ParseUnsigned(const std::string& text, uint64_t* out) {
  if (text.empty() || text.size() > 20 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE) return false;
  *out = v;
  return true;
}
}  // namespace

StatusOr<std::vector<RecordIndexEntry>> ReadRecordIndex(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(StrCat("cannot open index file ", path));
  std::vector<RecordIndexEntry> entries;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string key, offset, rest;
    RecordIndexEntry e;
    // Whole unsigned numbers only (">> uint64_t" would take "-1" as 2^64 - 1).
    if (!(fields >> key >> offset) || (fields >> rest) || !ParseUnsigned(key, &e.key) ||
        !ParseUnsigned(offset, &e.offset)) {
      return Status::InvalidArgument(StrCat(path, ":", line_no,
                                            ": expected 'key<TAB>offset' (two unsigned "
                                            "integers), got '",
                                            line, "'"));
    }
    entries.push_back(e);
  }
  return entries;
}

Status WriteRecordIndex(const std::string& path, const std::vector<RecordIndexEntry>& entries) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return Status::IOError(StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  for (const RecordIndexEntry& e : entries) {
    std::fprintf(f, "%llu\t%llu\n", static_cast<unsigned long long>(e.key),
                 static_cast<unsigned long long>(e.offset));
  }
  const bool failed = std::ferror(f) != 0;
  if (std::fclose(f) != 0 || failed) {
    return Status::IOError(StrCat("writing ", path, " failed: ", std::strerror(errno)));
  }
  return Status::Ok();
}

Status CommitRecordFiles(const std::string& rec, const std::string& idx) {
  const std::string rec_part = rec + ".part", idx_part = idx + ".part";
  if (std::remove(idx.c_str()) != 0 && errno != ENOENT) {
    return Status::IOError(StrCat("cannot remove the old ", idx, ": ", std::strerror(errno)));
  }
  for (const auto& [from, to] : {std::pair(rec_part, rec), std::pair(idx_part, idx)}) {
    if (std::rename(from.c_str(), to.c_str()) != 0) {
      return Status::IOError(
          StrCat("cannot rename ", from, " to ", to, ": ", std::strerror(errno)));
    }
  }
  return Status::Ok();
}

}  // namespace pstrain
