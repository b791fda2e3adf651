#include "data/rec_tools.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <unordered_set>

namespace pstrain {
namespace fs = std::filesystem;
namespace {

uint64_t AlignUp4(uint64_t n) { return (n + 3) & ~uint64_t{3}; }

const char* FormatName(ImageFormat f) {
  switch (f) {
    case ImageFormat::kJpeg:
      return "jpeg";
    case ImageFormat::kPng:
      return "png";
    case ImageFormat::kUnknown:
      break;
  }
  return "other";
}

// The image stage of a scan: header, and at kDecode every pixel. `img` is the
// thread's reusable buffer.
void InspectImage(const std::string& path, RecordScanDepth depth, ImageDecoder* decoder, Image* img,
                  ScannedRecord* r) {
  if (!r->ok()) return;
  const std::string where = StrCat(path, ":", r->offset);
  Status s = decoder->ReadInfo(r->record.image, where, &r->image);
  if (s.ok() && depth == RecordScanDepth::kDecode) {
    s = decoder->Decode(r->record.image, where, r->image.channels, img);
    if (s.ok()) {
      const int c = img->channels;
      std::vector<uint64_t> sums(c, 0);
      for (int y = 0; y < img->height; ++y) {
        const uint8_t* p = img->row(y);
        for (int x = 0; x < img->width; ++x, p += c) {
          for (int k = 0; k < c; ++k) sums[k] += p[k];
        }
      }
      const double pixels = static_cast<double>(img->height) * img->width;
      r->channel_means.resize(c);
      for (int k = 0; k < c; ++k) r->channel_means[k] = sums[k] / pixels;
    }
  }
  if (!s.ok()) {
    r->problem = RecordProblem::kImage;
    r->status = s;
  }
}

}  // namespace

const char* RecordProblemName(RecordProblem problem) {
  switch (problem) {
    case RecordProblem::kNone:
      return "none";
    case RecordProblem::kFraming:
      return "framing";
    case RecordProblem::kHeader:
      return "header";
    case RecordProblem::kLabelCount:
      return "label count";
    case RecordProblem::kImage:
      return "image";
  }
  return "?";
}

Status ScanImageRecords(const RecordIOFile& file, const ScanOptions& options,
                        const RecordCallback& fn) {
  CHECK_GE(options.num_threads, 1);
  const bool images = options.depth >= RecordScanDepth::kImageHeader;
  const int threads = images ? options.num_threads : 1;
  // Records are framed one after another, their images looked at in parallel
  // a block at a time, and the block handed to `fn` in order.
  const size_t block = images ? 64 * static_cast<size_t>(threads) : 256;
  std::vector<ScannedRecord> recs(block);
  std::vector<std::string> scratch(block);
  std::vector<ImageDecoder> decoders(images ? threads : 0);
  std::vector<Image> buffers(images ? threads : 0);
  uint64_t pos = 0;
  int64_t index = 0;
  while (pos < file.size()) {
    const uint64_t block_begin = pos;
    size_t n = 0;
    for (; n < block && pos < file.size(); ++n) {
      ScannedRecord& r = recs[n];
      r = ScannedRecord();
      r.index = index++;
      r.offset = pos;
      uint64_t next = 0;
      Status s = file.ReadAt(pos, &r.payload, &scratch[n], &next);
      if (!s.ok()) {
        r.problem = RecordProblem::kFraming;
        r.status = s;
        r.payload = std::string_view();
        // Every aligned magic word with cflag 0 or 1 starts a record: go on there.
        r.end = file.SeekRecordBegin(pos + 4);
        pos = r.end;
        continue;
      }
      r.end = next;
      pos = next;
      // Each piece costs 8 header bytes; every piece but the last holds a
      // multiple of 4 bytes and stands for one dropped magic word.
      r.pieces = static_cast<int>((r.end - r.offset - AlignUp4(r.payload.size())) / 4 - 1);
      if (options.depth < RecordScanDepth::kHeader) continue;
      const std::string where = StrCat(file.path(), ":", r.offset);
      s = ParseImageRecord(r.payload, where, &r.record);
      if (!s.ok()) {
        r.problem = r.payload.size() < kImageRecordHeaderSize ? RecordProblem::kHeader
                                                              : RecordProblem::kLabelCount;
        r.status = s;
      } else if (options.label_width > 0 &&
                 r.record.labels.size() != static_cast<size_t>(options.label_width)) {
        r.problem = RecordProblem::kLabelCount;
        r.status =
            Status::Corruption(StrCat(where, ": ", r.record.labels.size(), " labels, expected ",
                                      options.label_width, " (the label width)"));
      }
    }
    if (images) {
      auto work = [&](int t) {
        for (size_t i = t; i < n; i += threads) {
          InspectImage(file.path(), options.depth, &decoders[t], &buffers[t], &recs[i]);
        }
      };
      std::vector<std::thread> pool;
      for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
      work(0);
      for (std::thread& th : pool) th.join();
    }
    for (size_t i = 0; i < n; ++i) RETURN_IF_ERROR(fn(recs[i]));
    // The block's views are dead: its pages need not stay mapped.
    file.ReleaseRange(block_begin, pos);
  }
  return Status::Ok();
}

// ---- summary ----

void RecordFileSummary::Add(const ScannedRecord& r) {
  ++records_;
  if (!r.ok()) {
    ++bad_;
    ++problems_[r.problem];
    return;
  }
  payload_bytes_ += r.payload.size();
  if (r.pieces > 1) ++split_records_;
  image_bytes_ += r.record.image.size();
  ++label_counts_[r.record.labels.size()];
  for (float l : r.record.labels) {
    ++labelled_;
    if (std::isnan(l)) {  // no place in an ordered map, nor in [min, max]
      ++nan_labels_;
      continue;
    }
    if (labelled_ == nan_labels_ + 1 || l < label_min_) label_min_ = l;
    if (labelled_ == nan_labels_ + 1 || l > label_max_) label_max_ = l;
    auto it = label_values_.find(l);
    if (it != label_values_.end()) {
      ++it->second;
    } else if (label_values_.size() < kMaxDistinct) {
      label_values_.emplace(l, 1);
    } else {
      more_label_values_ = true;
    }
  }
  if (r.image.width > 0) {
    ++formats_[r.image.format];
    const auto key = std::make_tuple(r.image.width, r.image.height, r.image.channels);
    auto it = image_sizes_.find(key);
    if (it != image_sizes_.end()) {
      ++it->second;
    } else if (image_sizes_.size() < kMaxDistinct) {
      image_sizes_.emplace(key, 1);
    } else {
      more_image_sizes_ = true;
    }
    if (sized_ == 0) {
      min_width_ = max_width_ = r.image.width;
      min_height_ = max_height_ = r.image.height;
    }
    min_width_ = std::min(min_width_, r.image.width);
    max_width_ = std::max(max_width_, r.image.width);
    min_height_ = std::min(min_height_, r.image.height);
    max_height_ = std::max(max_height_, r.image.height);
    ++sized_;
  }
}

std::string RecordFileSummary::ToString() const {
  constexpr size_t kShown = 12;
  std::string out =
      StrCat("records: ", records_, " (", bad_, " bad); bytes: ", file_bytes_, " in the file, ",
             payload_bytes_, " in good records, ", image_bytes_, " of them images\n");
  out += StrCat("records split into pieces: ", split_records_, "\n");
  if (!formats_.empty()) {
    out += "formats:";
    for (const auto& [f, n] : formats_) out += StrCat(" ", FormatName(f), " ", n);
    out += "\n";
  }
  out += "labels per record:";
  for (const auto& [count, n] : label_counts_) out += StrCat(" ", count, " (", n, ")");
  out += "\n";
  if (labelled_ > nan_labels_) {
    out += StrCat("label values: ", label_values_.size(), more_label_values_ ? "+" : "",
                  " distinct in [", FormatLabel(label_min_), ", ", FormatLabel(label_max_), "]:");
    size_t shown = 0;
    for (const auto& [v, n] : label_values_) {
      if (shown++ == kShown) {
        out += " ...";
        break;
      }
      out += StrCat(" ", FormatLabel(v), " (", n, ")");
    }
    out += "\n";
  }
  if (nan_labels_ > 0) out += StrCat("labels that are not a number (nan): ", nan_labels_, "\n");
  if (sized_ > 0) {
    // The most common sizes first.
    std::vector<std::pair<int64_t, std::tuple<int, int, int>>> by_count;
    for (const auto& [size, n] : image_sizes_) by_count.emplace_back(-n, size);
    std::sort(by_count.begin(), by_count.end());
    out += StrCat("image sizes: ", image_sizes_.size(), more_image_sizes_ ? "+" : "",
                  " distinct, width ", min_width_, "..", max_width_, ", height ", min_height_, "..",
                  max_height_, ":");
    for (size_t i = 0; i < by_count.size() && i < kShown; ++i) {
      const auto& [w, h, c] = by_count[i].second;
      out += StrCat(" ", w, "x", h, "x", c, " (", -by_count[i].first, ")");
    }
    if (by_count.size() > kShown) out += " ...";
    out += "\n";
  }
  if (bad_ > 0) {
    out += "bad records by problem:";
    for (const auto& [p, n] : problems_) out += StrCat(" ", RecordProblemName(p), " ", n);
    out += "\n";
  }
  return out;
}

// ---- index ----

std::vector<std::string> CompareRecordIndex(const std::string& idx_path,
                                            const std::vector<RecordIndexEntry>& entries,
                                            const std::vector<RecordStart>& starts,
                                            size_t max_problems) {
  std::vector<std::string> problems;
  size_t more = 0;
  auto report = [&](std::string line) {
    if (problems.size() < max_problems) {
      problems.push_back(std::move(line));
    } else {
      ++more;
    }
  };
  std::vector<bool> listed(starts.size(), false);
  for (size_t i = 0; i < entries.size(); ++i) {
    const RecordIndexEntry& e = entries[i];
    auto it =
        std::lower_bound(starts.begin(), starts.end(), e.offset,
                         [](const RecordStart& s, uint64_t offset) { return s.offset < offset; });
    if (it == starts.end() || it->offset != e.offset) {
      report(StrCat(idx_path, ": entry ", i, " (key ", e.key, "): byte ", e.offset,
                    " is not the start of a readable record"));
      continue;
    }
    listed[it - starts.begin()] = true;
    if (e.key != it->id && e.key != static_cast<uint64_t>(it->index)) {
      report(StrCat(idx_path, ": entry ", i, ": key ", e.key, " but the record at byte ", e.offset,
                    " has id ", it->id, " and is record ", it->index));
    }
  }
  int64_t unlisted = 0;
  const RecordStart* first_unlisted = nullptr;
  for (size_t i = 0; i < starts.size(); ++i) {
    if (listed[i]) continue;
    if (first_unlisted == nullptr) first_unlisted = &starts[i];
    ++unlisted;
  }
  if (unlisted > 0) {
    report(StrCat(idx_path, ": ", unlisted, " record(s) not in the index, the first record ",
                  first_unlisted->index, " at byte ", first_unlisted->offset));
  }
  if (more > 0) problems.push_back(StrCat(idx_path, ": ", more, " more problem(s)"));
  return problems;
}

StatusOr<std::vector<RecordIndexEntry>> BuildRecordIndex(const RecordIOFile& file, IndexKey key) {
  ScanOptions opts;
  opts.depth = key == IndexKey::kId ? RecordScanDepth::kHeader : RecordScanDepth::kFraming;
  std::vector<RecordIndexEntry> entries;
  RETURN_IF_ERROR(ScanImageRecords(file, opts, [&](const ScannedRecord& r) -> Status {
    if (!r.ok()) {
      return Status::Corruption(StrCat("record ", r.index, " at byte ", r.offset, " is damaged (",
                                       RecordProblemName(r.problem), "): ", r.status.message()));
    }
    entries.push_back(RecordIndexEntry{
        key == IndexKey::kId ? r.record.header.id : static_cast<uint64_t>(r.index), r.offset});
    return Status::Ok();
  }));
  return entries;
}

// ---- unpack ----

namespace {

Status WriteWholeFile(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return Status::IOError(StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  const size_t written = std::fwrite(bytes.data(), 1, bytes.size(), f);
  const int write_errno = errno;
  const int close_rc = std::fclose(f);
  if (written != bytes.size()) {
    return Status::IOError(StrCat("writing ", path, " failed: ", std::strerror(write_errno)));
  }
  if (close_rc != 0) {
    return Status::IOError(StrCat("closing ", path, " failed: ", std::strerror(errno)));
  }
  return Status::Ok();
}

}  // namespace

Status UnpackRecordFile(const RecordIOFile& file, const std::string& dir,
                        const UnpackOptions& options,
                        const std::function<void(const ScannedRecord&)>& on_bad,
                        UnpackStats* stats) {
  *stats = UnpackStats();
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) {
      return Status::FailedPrecondition(StrCat(dir, " exists and is not a folder"));
    }
    if (!options.force && !fs::is_empty(dir, ec)) {
      return Status::FailedPrecondition(
          StrCat(dir, " already holds files (pass --force to write into it anyway)"));
    }
  } else if (!fs::create_directories(dir, ec)) {
    return Status::IOError(StrCat("cannot create folder ", dir, ": ", ec.message()));
  }
  fs::path name = fs::path(file.path()).filename();
  if (name.extension() == ".rec") name = name.stem();
  stats->list_path = (fs::path(dir) / name).string() + ".lst";
  std::FILE* list = std::fopen(stats->list_path.c_str(), "w");
  if (list == nullptr) {
    return Status::IOError(StrCat("cannot create ", stats->list_path, ": ", std::strerror(errno)));
  }
  std::unordered_set<uint64_t> ids;
  ScanOptions opts;
  opts.depth = RecordScanDepth::kHeader;
  Status s = ScanImageRecords(file, opts, [&](const ScannedRecord& r) -> Status {
    if (!r.ok()) {
      ++stats->bad;
      if (on_bad) on_bad(r);
      return Status::Ok();
    }
    const ImageRecordHeader& h = r.record.header;
    const ImageFormat format = DetectImageFormat(r.record.image);
    const char* ext = format == ImageFormat::kJpeg  ? ".jpg"
                      : format == ImageFormat::kPng ? ".png"
                                                    : ".bin";
    std::string image_name = std::to_string(h.id);
    if (!ids.insert(h.id).second) image_name += StrCat("_", r.index);
    image_name += ext;
    RETURN_IF_ERROR(WriteWholeFile((fs::path(dir) / image_name).string(), r.record.image));
    std::string line = std::to_string(h.id);
    for (float l : r.record.labels) line += "\t" + FormatListLabel(l);
    line += "\t" + image_name + "\n";
    if (std::fputs(line.c_str(), list) < 0) {
      return Status::IOError(
          StrCat("writing ", stats->list_path, " failed: ", std::strerror(errno)));
    }
    if (h.flag == 1 || (h.flag > 1 && h.label != 0.0f) || h.id2 != 0) ++stats->not_repackable;
    ++stats->written;
    return Status::Ok();
  });
  if (std::fclose(list) != 0 && s.ok()) {
    s = Status::IOError(StrCat("writing ", stats->list_path, " failed: ", std::strerror(errno)));
  }
  return s;
}

// ---- labels ----

std::string FormatLabel(float label) {
  if (std::isnan(label)) return "nan";
  char buf[64];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, static_cast<double>(label));
    if (std::strtof(buf, nullptr) == label) break;
  }
  return buf;
}

std::string FormatListLabel(float label) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%f", static_cast<double>(label));
  const float back = std::strtof(buf, nullptr);
  if (std::memcmp(&back, &label, sizeof(float)) == 0) return buf;
  return FormatLabel(label);
}

}  // namespace pstrain
