// `pstrain summary`: each layer's output shape and parameter count of a model.
#include <gflags/gflags.h>

#include <cstdio>
#include <string>

#include "models/models.h"
#include "tools/commands.h"
#include "worker/train_config.h"

DECLARE_string(network);
DECLARE_int32(num_layers);
DECLARE_string(image_shape);
DECLARE_int32(num_classes);

namespace pstrain {

int RunSummary(int argc, char** argv) {
  if (FLAGS_network.empty()) {
    std::fprintf(stderr, "pstrain summary: --network is required\n");
    return 2;
  }
  auto dims = ParseIntList(FLAGS_image_shape, "--image-shape");
  if (!dims.ok() || (!dims->empty() && dims->size() != 3)) {
    std::fprintf(stderr, "pstrain summary: --image-shape='%s' must be C,H,W\n",
                 FLAGS_image_shape.c_str());
    return 2;
  }
  ModelOptions mo;
  mo.name = FLAGS_network;
  mo.num_layers = FLAGS_num_layers;
  mo.image_shape = Shape(*dims);
  mo.num_classes = FLAGS_num_classes;
  auto graph = BuildModel(mo);
  if (!graph.ok()) {
    std::fprintf(stderr, "pstrain summary: %s\n", graph.status().ToString().c_str());
    return 2;
  }
  std::printf("%-32s %-16s %-20s %12s\n", "layer", "op", "output shape", "parameters");
  for (const LayerSummary& row : graph->Summary()) {
    std::printf("%-32s %-16s %-20s %12lld\n", row.name.c_str(), row.op.c_str(),
                row.out_shape.ToString().c_str(), static_cast<long long>(row.num_params));
  }
  std::printf("total parameters: %lld\n", static_cast<long long>(graph->NumParams()));
  return 0;
}

}  // namespace pstrain
