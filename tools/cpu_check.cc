// Compiled for the base x86-64 level whatever PSTRAIN_ARCH says
// (tools/CMakeLists.txt), so that the check itself runs on any x86-64 CPU.
#include "tools/cpu_check.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifndef PSTRAIN_ARCH
#define PSTRAIN_ARCH ""
#endif

namespace pstrain {

const char* BuildArch() { return PSTRAIN_ARCH; }

bool CpuCanRun(const char* arch, bool (*supports)(const char* level), char* msg, size_t n) {
  static const char* const kLevels[] = {"x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"};
  for (const char* level : kLevels) {
    if (std::strcmp(arch, level) != 0) continue;
    if (supports(level)) return true;
    std::snprintf(msg, n,
                  "pstrain: this binary was built for %s (-DPSTRAIN_ARCH=%s) and this CPU does "
                  "not support that level; rebuild with -DPSTRAIN_ARCH=x86-64-v2 (the default), "
                  "which runs on any x86-64 server of today",
                  arch, arch);
    return false;
  }
  return true;
}

namespace {

#if defined(__x86_64__) && defined(__GNUC__)
// The features each level adds (the x86-64 psABI's list; __builtin_cpu_supports
// needs literals, and not every compiler knows the level names).
bool CpuSupports(const char* level) {
  __builtin_cpu_init();
  const bool v2 = __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("sse3") &&
                  __builtin_cpu_supports("ssse3") && __builtin_cpu_supports("sse4.1") &&
                  __builtin_cpu_supports("sse4.2");
  const bool v3 = v2 && __builtin_cpu_supports("avx") && __builtin_cpu_supports("avx2") &&
                  __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
                  __builtin_cpu_supports("fma");
  const bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
  if (std::strcmp(level, "x86-64-v2") == 0) return v2;
  if (std::strcmp(level, "x86-64-v3") == 0) return v3;
  if (std::strcmp(level, "x86-64-v4") == 0) return v4;
  return true;
}

// Priority 101: before the default-priority static constructors of the
// binary's other files, which are compiled for PSTRAIN_ARCH.
__attribute__((constructor(101))) void CheckCpuAtStart() {
  char msg[512];
  if (CpuCanRun(PSTRAIN_ARCH, CpuSupports, msg, sizeof(msg))) return;
  std::fprintf(stderr, "%s\n", msg);
  std::_Exit(70);
}
#endif

}  // namespace
}  // namespace pstrain
