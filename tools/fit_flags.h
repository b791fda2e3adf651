// MXNet fit.py's training flags (--network, --lr, ...; see
// proto/train_config.proto for the list and defaults) and the --config file.
// The flags are defined in fit_flags.cc and shared by `train`, `summary` and
// `export`.
#ifndef PSTRAIN_TOOLS_FIT_FLAGS_H_
#define PSTRAIN_TOOLS_FIT_FLAGS_H_

#include <string>

#include "common/status.h"
#include "nn/graph.h"
#include "proto/train_config.pb.h"

namespace pstrain {

// Whether flag `name` is one MergedConfigFromFlags reads into the config:
// those of fit_flags.cc (`file` is where gflags says the flag is defined),
// and image_flags.cc's --data-train and --data-val (the config's RecordIO
// paths). `pstrain` takes these for every command that reads the config.
bool IsFitFlag(const std::string& name, const std::string& file);

// The --config text file when given, then every fit flag set explicitly on
// the command line (flags win), not validated as a training run: what
// `summary` and `export` read. Errors name the file:line:column or the flag.
StatusOr<TrainConfig> MergedConfigFromFlags();

// The effective config of a training run: MergedConfigFromFlags, validated.
StatusOr<TrainConfig> TrainConfigFromFlags();

// The zoo model the config's network fields name (network, num_layers,
// image_shape, num_classes), as `summary` and `export` build it without a
// data set. InvalidArgument naming the flag when one is wrong.
StatusOr<Graph> ModelFromConfig(const TrainConfig& cfg);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_FIT_FLAGS_H_
