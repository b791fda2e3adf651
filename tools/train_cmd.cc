// `pstrain train`: MXNet fit.py's training for one worker.
#include <cstdio>
#include <string>

#include "models/models.h"
#include "tools/commands.h"
#include "tools/fit_flags.h"
#include "worker/train_config.h"
#include "worker/train_log.h"
#include "worker/trainer.h"

namespace pstrain {

int RunTrain(int argc, char** argv) {
  // The cluster-role hook (tools/cluster_role.h, parameter-server area) runs
  // first here once merged: a scheduler or server process never returns from it.
  if (argc > 1) {
    std::fprintf(stderr, "pstrain train: unexpected argument '%s'\n", argv[1]);
    return 2;
  }
  auto cfg = TrainConfigFromFlags();
  if (!cfg.ok()) {
    std::fprintf(stderr, "pstrain train: %s\n", cfg.status().ToString().c_str());
    return 2;
  }
  TrainLog log;
  std::string text = EffectiveConfigText(*cfg);
  std::string one_line;
  for (char c : text) one_line += c == '\n' ? std::string("; ") : std::string(1, c);
  log.Info("start with arguments " + one_line);
  TrainerEnv env;
  env.log = &log;
  env.build_model = BuildModel;
  auto trainer = Trainer::Create(*cfg, env);
  if (!trainer.ok()) {
    std::fprintf(stderr, "pstrain train: %s\n", trainer.status().ToString().c_str());
    return 1;
  }
  Status s = (*trainer)->Run();
  if (!s.ok()) {
    std::fprintf(stderr, "pstrain train: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace pstrain
