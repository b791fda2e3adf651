// Reading whole files into memory, transparently gunzipping `.gz` files.
#ifndef PSTRAIN_DATA_FILE_BYTES_H_
#define PSTRAIN_DATA_FILE_BYTES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain {

// The bytes of `path`; a name ending in ".gz" is decompressed (zlib), so byte
// offsets in later errors are offsets in the uncompressed stream. NotFound if
// the file does not exist, IOError if it cannot be read, Corruption for a
// damaged or truncated gzip stream (naming the uncompressed offset reached).
StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path);

bool FileExists(const std::string& path);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_FILE_BYTES_H_
