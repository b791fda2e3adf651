// MXNet fit.py's training flags (--network, --lr, ...; see
// proto/train_config.proto for the list and defaults) and the --config file.
// The flags are defined in fit_flags.cc and shared by `train`, `summary` and
// `export`.
#ifndef PSTRAIN_TOOLS_FIT_FLAGS_H_
#define PSTRAIN_TOOLS_FIT_FLAGS_H_

#include "common/status.h"
#include "nn/graph.h"
#include "proto/train_config.pb.h"

namespace pstrain {

// The effective config: the --config text file when given, then every fit
// flag set explicitly on the command line (flags win), validated. Errors name
// the file:line:column or the flag.
StatusOr<TrainConfig> TrainConfigFromFlags();

// The zoo model the network flags name (--network, --num-layers,
// --image-shape, --num-classes), as `summary` and `export` build it without a
// data set. InvalidArgument naming the flag when one is wrong.
StatusOr<Graph> ModelFromFlags();

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_FIT_FLAGS_H_
