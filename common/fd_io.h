// Writing to a file descriptor.
#ifndef PSTRAIN_COMMON_FD_IO_H_
#define PSTRAIN_COMMON_FD_IO_H_

#include <cstddef>
#include <string>

namespace pstrain {

// Writes all `len` bytes to `fd`, retrying on EINTR and short writes. Returns
// false at the first other error (the rest is dropped: a closed terminal or
// pipe must not stop the caller). Async-signal-safe: a forked child may use it.
bool WriteAll(int fd, const void* data, size_t len);
inline bool WriteAll(int fd, const std::string& s) { return WriteAll(fd, s.data(), s.size()); }

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_FD_IO_H_
