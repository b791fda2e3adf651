// The instruction set this binary was compiled for, checked against the CPU
// it starts on. A binary copied to a host whose CPU lacks what it was built
// for (`--sync-dst-dir` copies it to every host of a job) would otherwise die
// with SIGILL somewhere in its first hot loop; with this check it exits at
// once with a message that names the level and the fix.
#ifndef PSTRAIN_TOOLS_CPU_CHECK_H_
#define PSTRAIN_TOOLS_CPU_CHECK_H_

#include <cstddef>

namespace pstrain {

// The -march the C and C++ code was compiled for ("x86-64-v2", "native", ...),
// or "" for the compiler's default (CMake's PSTRAIN_ARCH).
const char* BuildArch();

// Whether this CPU can run code built for `arch`. When it cannot, writes the
// error (NUL-terminated, truncated to `n` bytes) to `msg` and returns false.
// An `arch` that is not an x86-64 level (x86-64, x86-64-v2, -v3, -v4: native,
// a named CPU, "") counts as runnable: only the levels can be asked about.
// `supports` answers for one level. Plain C strings: this runs before the
// C++ runtime of the rest of the binary is set up.
bool CpuCanRun(const char* arch, bool (*supports)(const char* level), char* msg, size_t n);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_CPU_CHECK_H_
