#include <google/protobuf/stubs/common.h>
#include <zmq.h>

#include <cstdio>
#include <string>

#include "nn/backend.h"
#include "tools/commands.h"
#include "tools/cpu_check.h"

#ifndef PSTRAIN_VERSION
#define PSTRAIN_VERSION "0.0.0"
#endif
#ifndef PSTRAIN_BUILD_TYPE
#define PSTRAIN_BUILD_TYPE "unknown"
#endif

namespace pstrain {

int RunVersion(int /*argc*/, char** /*argv*/) {
  int major = 0, minor = 0, patch = 0;
  zmq_version(&major, &minor, &patch);
  const char* arch = BuildArch();
  std::printf("pstrain %s (%s build, %s%s)\n", PSTRAIN_VERSION, PSTRAIN_BUILD_TYPE,
              *arch ? "-march=" : "compiler's default -march", arch);
  std::printf("  zeromq %d.%d.%d, protobuf %s\n", major, minor, patch,
              google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION).c_str());
  std::string backends;
  for (const std::string& b : Backend::Names()) backends += (backends.empty() ? "" : ", ") + b;
  std::string why;
  const int gpus = GpuCount(&why);
  std::printf("  backends: %s; GPUs: %d%s%s\n", backends.c_str(), gpus, gpus ? "" : " (",
              gpus ? "" : (why + ")").c_str());
  return 0;
}

}  // namespace pstrain
