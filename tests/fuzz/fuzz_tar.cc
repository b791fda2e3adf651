// A data set archive (.tar.gz) as `pstrain data get` unpacks it: the bytes
// come from a download, so a hostile archive must be refused or unpacked
// inside the destination, never crash and never write outside it. The input's
// first byte chooses: bit 0 clear, the rest is a tar stream that the harness
// gzips (so mutations reach the tar headers), and with bit 2 set the harness
// first gives every header along the stream its right checksum (so mutated
// headers get past the checksum); bit 0 set, the rest is the .tar.gz file
// itself (the gzip layer); bit 1 unpacks with a strip prefix.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "data/tar_gz.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// Walks the tar stream header by header as a reader would and writes each
// header's checksum (octal, as tar does).
void FixChecksums(std::string* tar) {
  size_t at = 0;
  while (at + 512 <= tar->size()) {
    char* h = tar->data() + at;
    uint64_t size = 0;
    for (int i = 124; i < 136 && h[i] >= '0' && h[i] <= '7'; ++i) size = size * 8 + (h[i] - '0');
    unsigned sum = 0;
    for (int i = 0; i < 512; ++i) sum += (i >= 148 && i < 156) ? ' ' : static_cast<uint8_t>(h[i]);
    std::snprintf(h + 148, 8, "%06o", sum & 0777777);
    h[155] = ' ';
    if (size > tar->size()) break;
    at += 512 + (size + 511) / 512 * 512;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pstrain;
  namespace fs = std::filesystem;
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string tar(rest);
  if ((data[0] & 5) == 4) FixChecksums(&tar);
  fuzz::MemFile archive((data[0] & 1) != 0 ? tar : fuzz::Gzip(tar, 1), "archive.tar.gz");
  // dest/out is the destination; dest/ holds nothing else, so anything that
  // appears beside out/ escaped it.
  const fs::path dest = fs::path(fuzz::LinkDir()) / "dest";
  const fs::path out = dest / "out";
  std::error_code ec;
  fs::remove_all(dest, ec);
  fs::create_directories(out, ec);
  if (ec) std::abort();
  std::vector<UnpackedFile> files;
  UnpackOptions options;
  options.strip_prefix = (data[0] & 2) != 0 ? "cifar-10-batches-bin/" : "";
  const Status s = UnpackTarGz(archive.path(), out.string(), options, &files);
  // (error_code forms: a harness that throws would be a false finding)
  for (fs::directory_iterator it(dest, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path() != out) std::abort();  // written outside the destination
  }
  for (fs::recursive_directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st;
    if (lstat(it->path().c_str(), &st) != 0) std::abort();
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) std::abort();  // a link or a device
  }
  if (ec) std::abort();
  std::map<std::string, int64_t> sizes;  // a member written twice: the last one counts
  for (const UnpackedFile& f : files) {
    const fs::path p(f.path);
    if (p.is_absolute()) std::abort();
    for (const auto& part : p) {
      if (part == "..") std::abort();
    }
    sizes[f.path] = f.size;
  }
  for (const auto& [path, bytes] : sizes) {
    if (s.ok() && fs::file_size(out / path, ec) != static_cast<uintmax_t>(bytes)) std::abort();
  }
  fs::remove_all(dest, ec);
  return 0;
}
