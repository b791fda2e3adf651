// `pstrain keygen FILE`: new CURVE keys for a job started by hand
// (net/job_keys.h). Every process of the job then gets PSTRAIN_KEY_FILE=FILE.
#include <cstdio>
#include <string>

#include "net/job_keys.h"
#include "tools/commands.h"

namespace pstrain {

int RunKeygen(int argc, char** argv) {
  if (argc != 2 || argv[1][0] == '-') {
    std::fprintf(stderr,
                 "usage: pstrain keygen FILE\n"
                 "  writes new keys for one job to FILE (mode 0600; an existing file is kept).\n"
                 "  Give every process of the job PSTRAIN_KEY_FILE=FILE (on every host, a copy\n"
                 "  only its user can read); `pstrain launch` makes keys for each job itself.\n");
    return argc == 2 && std::string(argv[1]) == "--help" ? 0 : 2;
  }
  auto keys = GenerateJobKeys();
  if (!keys.ok()) {
    std::fprintf(stderr, "pstrain keygen: %s\n", keys.status().ToString().c_str());
    return 1;
  }
  const Status s = WriteJobKeys(*keys, argv[1]);
  if (!s.ok()) {
    std::fprintf(stderr, "pstrain keygen: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf(
      "wrote the job's keys to %s (mode 0600); run every process of the job with "
      "PSTRAIN_KEY_FILE=%s\n",
      argv[1], argv[1]);
  return 0;
}

}  // namespace pstrain
