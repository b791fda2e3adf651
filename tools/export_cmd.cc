// `pstrain export`: a trained model as an ONNX file for inference elsewhere
// (ONNX Runtime, TensorRT, ...). The network comes from the same flags as
// `train` (--network, --num-layers, --image-shape, --num-classes: fit_flags.cc),
// the weights from a checkpoint (--params, or --model-prefix with
// --load-epoch); onnx/onnx_export.h says how each layer maps.
#include <gflags/gflags.h>

#include <cstdio>
#include <string>

#include "onnx/onnx_export.h"
#include "tools/commands.h"
#include "tools/fit_flags.h"
#include "worker/checkpoint.h"
#include "worker/train_config.h"

DECLARE_string(network);
DECLARE_string(model_prefix);
DECLARE_int32(load_epoch);

DEFINE_string(params, "",
              "checkpoint to export, e.g. mnist-0012.params; empty: "
              "<--model-prefix>-<--load-epoch>.params");
DEFINE_string(out, "", "the ONNX file to write, e.g. model.onnx (required)");

namespace pstrain {
namespace {

// "(N,1,28,28)" for the per-sample shape (1,28,28).
std::string WithBatch(const Shape& per_sample) {
  std::string out = "(N";
  for (int64_t d : per_sample.dims()) out += "," + std::to_string(d);
  return out + ")";
}

// Whether the parameters of `graph`, built at its model's default input
// shape, fix that shape's height and width: false when the same network at
// twice the size has the same parameter shapes (it ends in global pooling),
// so that a checkpoint trained at another size would fit it too.
bool ParamsFixTheInputSize(const TrainConfig& cfg, const Graph& graph) {
  const Shape& in = graph.node(graph.input_nodes()[0]).out_shape;
  if (in.ndim() != 3) return true;
  TrainConfig bigger = cfg;
  bigger.set_image_shape(StrCat(in[0], ",", 2 * in[1], ",", 2 * in[2]));
  StatusOr<Graph> other = ModelFromConfig(bigger);
  if (!other.ok() || other->params().size() != graph.params().size()) return true;
  for (size_t i = 0; i < graph.params().size(); ++i) {
    if (other->params()[i].shape != graph.params()[i].shape) return true;
  }
  return false;
}

}  // namespace

int RunExport(int /*argc*/, char** /*argv*/) {
  auto cfg = MergedConfigFromFlags();
  if (!cfg.ok()) {
    std::fprintf(stderr, "pstrain export: %s\n", cfg.status().ToString().c_str());
    return 2;
  }
  if (cfg->network().empty() || FLAGS_out.empty()) {
    std::fprintf(stderr,
                 "pstrain export: --network (or network: in the --config file) and --out are "
                 "required\n");
    return 2;
  }
  std::string params = FLAGS_params;
  if (params.empty()) {
    if (cfg->model_prefix().empty() || cfg->load_epoch() < 1) {
      const std::string given =
          cfg->model_prefix().empty()
              ? std::string(" (no --model-prefix given)")
              : StrCat(" (--load-epoch ", cfg->load_epoch(), ": the checkpoints count from 1)");
      std::fprintf(stderr,
                   "pstrain export: give --params FILE, or --model-prefix and --load-epoch%s\n",
                   given.c_str());
      return 2;
    }
    params = CheckpointParamsPath(cfg->model_prefix(), cfg->load_epoch());
  }
  auto graph = ModelFromConfig(*cfg);
  if (!graph.ok()) {
    std::fprintf(stderr, "pstrain export: %s\n", graph.status().ToString().c_str());
    return 2;
  }
  if (cfg->image_shape().empty() && !ParamsFixTheInputSize(*cfg, *graph)) {
    // The ONNX input would say the default size whatever size the checkpoint
    // was trained at, and nothing would catch it.
    std::fprintf(stderr,
                 "pstrain export: --image-shape is required for %s: its parameters do not fix the "
                 "input's height and width (its default is %s), so give the C,H,W it was trained "
                 "with (e.g. 3,32,32 for CIFAR-10)\n",
                 cfg->network().c_str(),
                 graph->node(graph->input_nodes()[0]).out_shape.ToString().c_str());
    return 2;
  }
  auto arrays = LoadArrays(params);
  if (!arrays.ok()) {
    std::fprintf(stderr, "pstrain export: %s\n", arrays.status().ToString().c_str());
    return 1;
  }
  OnnxExportOptions opts;
  opts.graph_name = cfg->network();
  opts.producer_version = PSTRAIN_VERSION;
  opts.source = params;
  auto model = ExportOnnx(*graph, *arrays, opts);
  if (!model.ok()) {
    std::fprintf(stderr, "pstrain export: %s\n", model.status().ToString().c_str());
    if (model.status().code() == StatusCode::kInvalidArgument) {
      std::fprintf(stderr,
                   "pstrain export: the network flags (--network, --num-layers, --image-shape, "
                   "--num-classes) must be those the checkpoint was trained with\n");
    }
    return 1;
  }
  Status s = WriteOnnxFile(*model, FLAGS_out);
  if (!s.ok()) {
    std::fprintf(stderr, "pstrain export: %s\n", s.ToString().c_str());
    return 1;
  }
  const Node& data = graph->node(graph->input_nodes()[0]);
  const Node& out = graph->node(graph->output());
  std::printf("wrote %s: %s, ONNX opset %d, input %s %s, output %s %s, %d nodes\n",
              FLAGS_out.c_str(), cfg->network().c_str(), kOnnxOpset, data.name.c_str(),
              WithBatch(data.out_shape).c_str(), out.name.c_str(), WithBatch(out.out_shape).c_str(),
              model->graph().node_size());
  return 0;
}

}  // namespace pstrain
