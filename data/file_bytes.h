// Reading whole files into memory, transparently gunzipping `.gz` files.
#ifndef PSTRAIN_DATA_FILE_BYTES_H_
#define PSTRAIN_DATA_FILE_BYTES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain {

// What a ".gz" may decompress to by default (the data sets read whole are
// far smaller; a gzip bomb stops here).
constexpr uint64_t kMaxGunzipBytes = uint64_t{1} << 32;

// The bytes of `path`; a name ending in ".gz" is decompressed (zlib), so byte
// offsets in later errors are offsets in the uncompressed stream. NotFound if
// the file does not exist, IOError if it cannot be read, Corruption for a
// damaged or truncated gzip stream (naming the uncompressed offset reached),
// ResourceExhausted for one that decompresses to more than `max_gunzip_bytes`.
StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path,
                                             uint64_t max_gunzip_bytes = kMaxGunzipBytes);

bool FileExists(const std::string& path);

// The bytes of the regular file `path` (an image a list names), at most
// `max_bytes`: NotFound or IOError if it cannot be opened or read,
// InvalidArgument for a directory, FIFO or device (a FIFO's read would wait
// for a writer, /dev/zero's would never end), ResourceExhausted past max_bytes.
Status ReadRegularFile(const std::string& path, uint64_t max_bytes, std::string* out);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_FILE_BYTES_H_
