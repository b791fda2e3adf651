#include "data/im2rec.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <new>
#include <sstream>
#include <thread>

#include "data/augment.h"
#include "data/file_bytes.h"
#include "data/image_codec.h"
#include "data/image_recordio.h"
#include "data/recordio.h"

namespace pstrain {
namespace fs = std::filesystem;
namespace {

bool HasExt(const fs::path& p, const std::vector<std::string>& exts) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return std::find(exts.begin(), exts.end(), ext) != exts.end();
}

// os.walk order: a folder's files (sorted), then each sub-folder (sorted), depth first.
Status Walk(const fs::path& root, const fs::path& dir, const std::vector<std::string>& exts,
            std::map<std::string, int>* classes, std::vector<ImageListEntry>* out) {
  std::vector<fs::path> files, dirs;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    // An entry whose type cannot be read (a dangling link, a link loop) is
    // passed over, not the end of the listing.
    std::error_code type_ec;
    if (it->is_directory(type_ec)) {
      dirs.push_back(it->path());
    } else if (it->is_regular_file(type_ec) && HasExt(it->path(), exts)) {
      files.push_back(it->path());
    }
  }
  if (ec) return Status::IOError(StrCat("listing ", dir.string(), ": ", ec.message()));
  std::sort(files.begin(), files.end());
  std::sort(dirs.begin(), dirs.end());
  for (const fs::path& f : files) {
    auto inserted = classes->emplace(dir.string(), static_cast<int>(classes->size()));
    ImageListEntry e;
    e.index = static_cast<int64_t>(out->size());
    e.labels = {static_cast<float>(inserted.first->second)};
    std::error_code rel_ec;
    e.path = fs::relative(f, root, rel_ec).string();
    if (rel_ec) return Status::IOError(StrCat(f.string(), ": ", rel_ec.message()));
    out->push_back(std::move(e));
  }
  for (const fs::path& d : dirs) RETURN_IF_ERROR(Walk(root, d, exts, classes, out));
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<ImageListEntry>> ListImageFolder(const std::string& root, bool recursive,
                                                      const std::vector<std::string>& exts) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return Status::NotFound(StrCat("no image folder ", root));
  std::vector<ImageListEntry> out;
  if (recursive) {
    std::map<std::string, int> classes;
    RETURN_IF_ERROR(Walk(root, root, exts, &classes, &out));
    return out;
  }
  std::vector<fs::path> files;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;  // as in Walk
    if (it->is_regular_file(type_ec) && HasExt(it->path(), exts)) files.push_back(it->path());
  }
  if (ec) return Status::IOError(StrCat("listing ", root, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    out.push_back(ImageListEntry{static_cast<int64_t>(out.size()), {0.0f}, f.filename().string()});
  }
  return out;
}

Status WriteImageList(const std::string& path, const std::vector<ImageListEntry>& entries) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return Status::IOError(StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  for (const ImageListEntry& e : entries) {
    std::fprintf(f, "%lld\t", static_cast<long long>(e.index));
    for (float l : e.labels) std::fprintf(f, "%f\t", l);
    std::fprintf(f, "%s\n", e.path.c_str());
  }
  if (std::fclose(f) != 0) {
    return Status::IOError(StrCat("writing ", path, " failed: ", std::strerror(errno)));
  }
  return Status::Ok();
}

StatusOr<std::vector<ImageListEntry>> ReadImageList(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(StrCat("cannot open list file ", path));
  std::vector<ImageListEntry> out;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::vector<std::string> fields;
    size_t start = 0;
    while (true) {
      size_t tab = line.find('\t', start);
      std::string f = line.substr(start, tab == std::string::npos ? tab : tab - start);
      // Surrounding blanks are not part of a field (im2rec.py strips them).
      const size_t first = f.find_first_not_of(" \t\r\n\v\f");
      const size_t last = f.find_last_not_of(" \t\r\n\v\f");
      fields.push_back(first == std::string::npos ? "" : f.substr(first, last - first + 1));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument(StrCat(path, ":", line_no, ": ", why, " in '", line, "'"));
    };
    if (fields.size() < 3) return bad("expected index<TAB>label[<TAB>label...]<TAB>path");
    ImageListEntry e;
    char* end = nullptr;
    errno = 0;
    e.index = std::strtoll(fields[0].c_str(), &end, 10);
    if (fields[0].empty() || *end != '\0' || errno == ERANGE || e.index < 0) {
      return bad("index '" + fields[0] + "' is not an integer in 0.." +
                 std::to_string(std::numeric_limits<int64_t>::max()));
    }
    for (size_t i = 1; i + 1 < fields.size(); ++i) {
      float v = std::strtof(fields[i].c_str(), &end);
      if (fields[i].empty() || *end != '\0')
        return bad("label '" + fields[i] + "' is not a number");
      e.labels.push_back(v);
    }
    e.path = fields.back();
    if (e.path.empty()) return bad("empty path");
    out.push_back(std::move(e));
  }
  return out;
}

StatusOr<std::vector<std::string>> MakeImageLists(const std::string& prefix,
                                                  const std::string& root,
                                                  const MakeListOptions& options) {
  if (options.train_ratio < 0 || options.test_ratio < 0 ||
      options.train_ratio + options.test_ratio > 1.0 + 1e-9) {
    return Status::InvalidArgument(StrCat("train ratio ", options.train_ratio, " and test ratio ",
                                          options.test_ratio, " must be >= 0 and sum to <= 1"));
  }
  ASSIGN_OR_RETURN(std::vector<ImageListEntry> all,
                   ListImageFolder(root, options.recursive, options.exts));
  if (all.empty()) {
    // Class folders without --recursive: say so, as that is the usual cause.
    std::string hint;
    if (!options.recursive) {
      std::error_code ec;
      for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end;
           it.increment(ec)) {
        if (it->is_directory(ec)) {
          hint = StrCat(" (its images may be in folders such as '", it->path().filename().string(),
                        "': --recursive lists them, a label per folder)");
          break;
        }
      }
    }
    return Status::NotFound(StrCat("no images under ", root, hint));
  }
  if (options.shuffle) {
    Rng rng(options.seed);
    for (size_t i = all.size(); i > 1; --i) std::swap(all[i - 1], all[rng.Next() % i]);
  }
  std::vector<std::string> written;
  auto write = [&](const std::string& path, size_t begin, size_t end) -> Status {
    std::vector<ImageListEntry> part(all.begin() + begin, all.begin() + end);
    RETURN_IF_ERROR(WriteImageList(path, part));
    written.push_back(path);
    return Status::Ok();
  };
  const size_t n = all.size();
  if (options.train_ratio == 1.0) {
    RETURN_IF_ERROR(write(prefix + ".lst", 0, n));
    return written;
  }
  const size_t sep = static_cast<size_t>(n * options.train_ratio);
  const size_t sep_test = static_cast<size_t>(n * options.test_ratio);
  if (options.test_ratio > 0) RETURN_IF_ERROR(write(prefix + "_test.lst", 0, sep_test));
  if (options.train_ratio + options.test_ratio < 1.0) {
    RETURN_IF_ERROR(write(prefix + "_val.lst", std::min(n, sep_test + sep), n));
  }
  RETURN_IF_ERROR(write(prefix + "_train.lst", sep_test, std::min(n, sep_test + sep)));
  return written;
}

namespace {

// Reads, and unless passing through, decodes / crops / resizes / re-encodes one
// image into a record payload. An error means "skip this image".
Status EncodeOne(const ImageListEntry& e, const std::string& root, const PackOptions& options,
                 ImageDecoder* decoder, std::string* payload) {
  const std::string file = (fs::path(root) / e.path).string();
  std::string bytes;
  RETURN_IF_ERROR(ReadRegularFile(file, kRecordIOMaxLength, &bytes));
  std::vector<float> labels = e.labels;
  if (!options.pack_label) labels.resize(1);
  std::string encoded;
  if (options.pass_through) {
    encoded = std::move(bytes);
  } else {
    Image img, work;
    RETURN_IF_ERROR(decoder->Decode(bytes, file, 3, &img));
    if (options.center_crop && img.height != img.width) {
      const int side = std::min(img.height, img.width);
      const int x0 = (img.width - side) / 2, y0 = (img.height - side) / 2;
      work.Resize(side, side, 3);
      for (int y = 0; y < side; ++y) {
        std::memcpy(work.row(y), img.row(y0 + y) + x0 * 3, static_cast<size_t>(side) * 3);
      }
      std::swap(img, work);
    }
    if (options.resize > 0) {
      int nh = 0, nw = 0;
      RETURN_IF_ERROR(ShorterSideTo(img.height, img.width, options.resize, file, &nh, &nw));
      ResizeBilinear(img, nh, nw, &work);
      std::swap(img, work);
    }
    RETURN_IF_ERROR(EncodeJpeg(img, options.quality, &encoded));
  }
  *payload = PackImageRecord(static_cast<uint64_t>(e.index), labels, encoded);
  if (payload->size() > kRecordIOMaxLength) {
    // Skipped here: the writer would refuse it and end the whole pack.
    return Status::ResourceExhausted(StrCat("its record of ", payload->size(),
                                            " bytes exceeds RecordIO's ", kRecordIOMaxLength));
  }
  return Status::Ok();
}

}  // namespace

Status PackImageList(const std::string& lst_path, const std::string& root,
                     const std::string& rec_path, const std::string& idx_path,
                     const PackOptions& options, PackStats* stats) {
  if (options.num_threads < 1 || options.num_threads > 256) {
    return Status::InvalidArgument(
        StrCat("im2rec threads must be in [1, 256], got ", options.num_threads));
  }
  if (options.resize < 0 || options.quality < 1 || options.quality > 100) {
    return Status::InvalidArgument(StrCat("resize ", options.resize, " must be >= 0 and quality ",
                                          options.quality, " in [1, 100]"));
  }
  ASSIGN_OR_RETURN(std::vector<ImageListEntry> entries, ReadImageList(lst_path));
  // Written beside, then put in place (CommitRecordFiles): a failed or
  // interrupted pack leaves the old pair as it was, not a new .rec beside the
  // old .idx, and a job reading the old .rec is not cut short. What a failed
  // pack wrote beside is removed.
  const RecordPartFiles parts(rec_path, idx_path);
  ASSIGN_OR_RETURN(std::unique_ptr<RecordIOWriter> writer, RecordIOWriter::Create(parts.rec));
  std::vector<RecordIndexEntry> index;
  *stats = PackStats();
  std::string first_skip;  // the first skipped image and why
  // Blocks of images are encoded in parallel, then written in list order.
  const size_t kBlock = 256 * static_cast<size_t>(options.num_threads);
  std::vector<std::string> payloads(kBlock);
  std::vector<Status> results(kBlock);
  std::vector<ImageDecoder> decoders(options.num_threads);
  for (size_t base = 0; base < entries.size(); base += kBlock) {
    const size_t count = std::min(kBlock, entries.size() - base);
    auto work = [&](int t) {
      for (size_t i = t; i < count; i += options.num_threads) {
        try {
          results[i] = EncodeOne(entries[base + i], root, options, &decoders[t], &payloads[i]);
        } catch (const std::bad_alloc&) {
          // An image too big for the memory left is skipped, not the process
          // ended (an exception leaving a thread would terminate it).
          payloads[i].clear();
          results[i] = Status::ResourceExhausted("out of memory encoding it");
        }
      }
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < options.num_threads; ++t) threads.emplace_back(work, t);
    work(0);
    for (std::thread& th : threads) th.join();
    for (size_t i = 0; i < count; ++i) {
      if (!results[i].ok()) {
        LOG(WARNING) << "im2rec: skipping " << entries[base + i].path << ": " << results[i];
        if (stats->skipped == 0) first_skip = StrCat(entries[base + i].path, ": ", results[i]);
        ++stats->skipped;
        continue;
      }
      index.push_back(
          RecordIndexEntry{static_cast<uint64_t>(entries[base + i].index), writer->Tell()});
      RETURN_IF_ERROR(writer->Write(payloads[i]));
      ++stats->written;
    }
  }
  RETURN_IF_ERROR(writer->Close());
  if (stats->written == 0 && stats->skipped > 0) {
    // Every image failed: most likely a wrong ROOT. An empty pack would
    // replace a good one, and a job would then read no records.
    return Status::NotFound(StrCat("every one of the ", stats->skipped, " images of ", lst_path,
                                   " was skipped (the first: ", first_skip, "); is '", root,
                                   "' the folder its paths are relative to? ", rec_path,
                                   " is left as it was"));
  }
  RETURN_IF_ERROR(WriteRecordIndex(parts.idx, index));
  return CommitRecordFiles(rec_path, idx_path);
}

}  // namespace pstrain
