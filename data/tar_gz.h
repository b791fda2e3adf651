// Unpacking .tar.gz archives (POSIX ustar and GNU tar, as `tar -czf` writes
// them) into a folder, for data sets shipped as archives (CIFAR-10).
#ifndef PSTRAIN_DATA_TAR_GZ_H_
#define PSTRAIN_DATA_TAR_GZ_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain {

struct UnpackOptions {
  // Removed from every member's path; members outside it are skipped.
  std::string strip_prefix;
};

struct UnpackedFile {
  std::string path;  // relative to the destination folder
  int64_t size = 0;
};

// Unpacks the regular files and folders of `archive` under `dest_dir` (which
// must exist). Every file is written to "<path>.part" and renamed to its name
// once complete, so an interrupted unpack never leaves a short file under a
// member's name. Refused (InvalidArgument naming the member): absolute paths,
// ".." components, and links or devices. A bad header checksum, a member cut
// short or a broken gzip stream is Corruption naming the archive and byte
// offset (in the uncompressed tar stream). *files (optional) receives what was
// written, in archive order.
Status UnpackTarGz(const std::string& archive, const std::string& dest_dir,
                   const UnpackOptions& options, std::vector<UnpackedFile>* files);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_TAR_GZ_H_
