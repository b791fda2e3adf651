#include "nn/cuda/cudnn_graph.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

#include "nn/cuda/cuda_check.h"

namespace pstrain::internal {
namespace {

// The graph and the plan take the handle where cuDNN still wants it (9.x
// marks both attributes deprecated, optional since 9.8; its frontend still
// sets the graph's): the graph's is set, the plan's tried.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
constexpr cudnnBackendAttributeName_t kGraphHandle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
constexpr cudnnBackendAttributeName_t kPlanHandle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

// Unique ids of the three tensors in every direction's graph.
constexpr int64_t kXUid = 1, kWUid = 2, kYUid = 3;

cudnnStatus_t SetInt64s(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                        const int64_t* values, int64_t n) {
  return cudnnBackendSetAttribute(d, name, CUDNN_TYPE_INT64, n, values);
}
cudnnStatus_t SetDescriptor(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                            const BackendDescriptor& value) {
  cudnnBackendDescriptor_t v = value.get();
  return cudnnBackendSetAttribute(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

}  // namespace

const char* ConvDirectionName(ConvDirection d) {
  switch (d) {
    case ConvDirection::kForward:
      return "forward";
    case ConvDirection::kBackwardData:
      return "backward data";
    case ConvDirection::kBackwardFilter:
      return "backward filter";
  }
  return "?";
}

BackendDescriptor::~BackendDescriptor() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
}

BackendDescriptor& BackendDescriptor::operator=(BackendDescriptor&& o) noexcept {
  if (this != &o) {
    if (d_) cudnnBackendDestroyDescriptor(d_);
    d_ = o.d_;
    o.d_ = nullptr;
  }
  return *this;
}

StatusOr<BackendDescriptor> BackendDescriptor::Create(cudnnBackendDescriptorType_t type) {
  BackendDescriptor d;
  PSTRAIN_CUDNN_RETURN_IF_ERROR(
      cudnnBackendCreateDescriptor(type, d.addr()),
      StrCat("cudnnBackendCreateDescriptor(", static_cast<int>(type), ")"));
  return d;
}

GraphConvolution::~GraphConvolution() = default;

StatusOr<std::unique_ptr<GraphConvolution>> GraphConvolution::Create(cudnnHandle_t handle,
                                                                     ConvDirection direction,
                                                                     const ConvGeometry& g,
                                                                     float beta) {
  std::unique_ptr<GraphConvolution> c(new GraphConvolution(handle));
  c->where_ =
      StrCat("cuDNN graph (", ConvDirectionName(direction), ", x ", g.x[0], "x", g.x[1], "x",
             g.x[2], "x", g.x[3], ", w ", g.w[0], "x", g.w[1], "x", g.w[2], "x", g.w[3], ")");
  const std::string& where = c->where_;
#define PSTRAIN_GRAPH_TRY(expr, what) PSTRAIN_CUDNN_RETURN_IF_ERROR(expr, StrCat(where, ": ", what))

  auto tensor = [&](const int64_t dims[4], int64_t uid, BackendDescriptor* out) -> Status {
    ASSIGN_OR_RETURN(*out, BackendDescriptor::Create(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
    const int64_t strides[4] = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
    const cudnnDataType_t type = CUDNN_DATA_FLOAT;
    const int64_t alignment = 16;  // the arena's and cudaMalloc's are 256
    cudnnBackendDescriptor_t d = out->get();
    PSTRAIN_GRAPH_TRY(
        cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type),
        "tensor type");
    PSTRAIN_GRAPH_TRY(SetInt64s(d, CUDNN_ATTR_TENSOR_DIMENSIONS, dims, 4), "tensor dimensions");
    PSTRAIN_GRAPH_TRY(SetInt64s(d, CUDNN_ATTR_TENSOR_STRIDES, strides, 4), "tensor strides");
    PSTRAIN_GRAPH_TRY(SetInt64s(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, &uid, 1), "tensor id");
    PSTRAIN_GRAPH_TRY(SetInt64s(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &alignment, 1),
                      "tensor alignment");
    PSTRAIN_GRAPH_TRY(cudnnBackendFinalize(d), "finalizing a tensor");
    return Status::Ok();
  };
  RETURN_IF_ERROR(tensor(g.x, kXUid, &c->x_));
  RETURN_IF_ERROR(tensor(g.w, kWUid, &c->w_));
  RETURN_IF_ERROR(tensor(g.y, kYUid, &c->y_));

  ASSIGN_OR_RETURN(c->conv_, BackendDescriptor::Create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR));
  {
    cudnnBackendDescriptor_t d = c->conv_.get();
    const int64_t spatial = 2, dilation[2] = {1, 1};
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    PSTRAIN_GRAPH_TRY(SetInt64s(d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &spatial, 1),
                      "spatial dimensions");
    PSTRAIN_GRAPH_TRY(cudnnBackendSetAttribute(d, CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
                                               CUDNN_TYPE_DATA_TYPE, 1, &compute),
                      "compute type");
    PSTRAIN_GRAPH_TRY(cudnnBackendSetAttribute(d, CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                                               CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode),
                      "mode");
    PSTRAIN_GRAPH_TRY(SetInt64s(d, CUDNN_ATTR_CONVOLUTION_DILATIONS, dilation, 2), "dilations");
    PSTRAIN_GRAPH_TRY(SetInt64s(d, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, g.stride, 2), "strides");
    PSTRAIN_GRAPH_TRY(SetInt64s(d, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, g.pad, 2), "paddings");
    PSTRAIN_GRAPH_TRY(SetInt64s(d, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, g.pad, 2), "paddings");
    PSTRAIN_GRAPH_TRY(cudnnBackendFinalize(d), "finalizing the convolution");
  }

  // The operation: its type and the attribute names of its three tensors.
  struct OpNames {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  };
  static constexpr OpNames kOps[] = {
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA},
  };
  const OpNames& names = kOps[static_cast<int>(direction)];  // ConvDirection's order
  ASSIGN_OR_RETURN(c->op_, BackendDescriptor::Create(names.type));
  {
    cudnnBackendDescriptor_t d = c->op_.get();
    const float alpha = 1.0f;
    PSTRAIN_GRAPH_TRY(SetDescriptor(d, names.x, c->x_), "operation x");
    PSTRAIN_GRAPH_TRY(SetDescriptor(d, names.w, c->w_), "operation w");
    PSTRAIN_GRAPH_TRY(SetDescriptor(d, names.y, c->y_), "operation y");
    PSTRAIN_GRAPH_TRY(SetDescriptor(d, names.conv, c->conv_), "operation convolution");
    PSTRAIN_GRAPH_TRY(cudnnBackendSetAttribute(d, names.alpha, CUDNN_TYPE_FLOAT, 1, &alpha),
                      "alpha");
    PSTRAIN_GRAPH_TRY(cudnnBackendSetAttribute(d, names.beta, CUDNN_TYPE_FLOAT, 1, &beta), "beta");
    PSTRAIN_GRAPH_TRY(cudnnBackendFinalize(d), "finalizing the operation");
  }

  ASSIGN_OR_RETURN(c->graph_, BackendDescriptor::Create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
  {
    cudnnBackendDescriptor_t d = c->graph_.get();
    PSTRAIN_GRAPH_TRY(cudnnBackendSetAttribute(d, kGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle),
                      "graph handle");
    PSTRAIN_GRAPH_TRY(SetDescriptor(d, CUDNN_ATTR_OPERATIONGRAPH_OPS, c->op_), "graph operation");
    PSTRAIN_GRAPH_TRY(cudnnBackendFinalize(d), "finalizing the operation graph");
  }
  return c;
}

Status GraphConvolution::ListPlans(bool tf32, size_t workspace_limit, int max_plans) {
  plans_.clear();
  RETURN_IF_ERROR(AddPlans(CUDNN_HEUR_MODE_A, tf32, workspace_limit, max_plans));
  // Mode A may propose few engines once the tensor-core ones are left out;
  // the fallback list adds some (its failure matters only with none).
  if (num_plans() < max_plans) {
    const Status fallback = AddPlans(CUDNN_HEUR_MODE_FALLBACK, tf32, workspace_limit, max_plans);
    if (!fallback.ok() && num_plans() == 0) return fallback;
  }
  return Status::Ok();
}

Status GraphConvolution::AddPlans(cudnnBackendHeurMode_t mode, bool tf32, size_t workspace_limit,
                                  int max_plans) {
  const std::string& where = where_;
  ASSIGN_OR_RETURN(BackendDescriptor heur,
                   BackendDescriptor::Create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR));
  PSTRAIN_GRAPH_TRY(SetDescriptor(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph_),
                    "heuristics graph");
  PSTRAIN_GRAPH_TRY(cudnnBackendSetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE,
                                             CUDNN_TYPE_HEUR_MODE, 1, &mode),
                    "heuristics mode");
  PSTRAIN_GRAPH_TRY(cudnnBackendFinalize(heur.get()), "finalizing the heuristics");
  int64_t count = 0;
  PSTRAIN_GRAPH_TRY(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                    "counting the heuristics' results");
  // The caller makes the descriptors the results are written into.
  std::vector<BackendDescriptor> configs(static_cast<size_t>(std::max<int64_t>(count, 0)));
  std::vector<cudnnBackendDescriptor_t> raw;
  for (BackendDescriptor& cfg : configs) {
    ASSIGN_OR_RETURN(cfg, BackendDescriptor::Create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(cfg.get());
  }
  int64_t got = 0;
  if (count > 0) {
    PSTRAIN_GRAPH_TRY(
        cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
        "the heuristics' results");
  }
  for (int64_t k = 0; k < got && static_cast<int>(plans_.size()) < max_plans; ++k) {
    // The engine's numerical notes decide whether it may run here.
    ASSIGN_OR_RETURN(BackendDescriptor engine,
                     BackendDescriptor::Create(CUDNN_BACKEND_ENGINE_DESCRIPTOR));
    cudnnBackendDescriptor_t e = engine.get();
    int64_t one = 0;
    if (cudnnBackendGetAttribute(configs[k].get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &one,
                                 &e) != CUDNN_STATUS_SUCCESS) {
      continue;
    }
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t num_notes = 0;
    if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &num_notes,
                                 notes) != CUDNN_STATUS_SUCCESS) {
      continue;
    }
    bool allowed = true;
    for (int64_t n = 0; n < num_notes; ++n) {
      allowed &= notes[n] != CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS &&
                 notes[n] != CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION &&
                 (tf32 || notes[n] != CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
    }
    // Engines compiled at run time (NVRTC) cost a compile per plan: left out.
    cudnnBackendBehaviorNote_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    int64_t num_behavior = 0;
    if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                 CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &num_behavior,
                                 behavior) == CUDNN_STATUS_SUCCESS) {
      for (int64_t n = 0; n < num_behavior; ++n) {
        allowed &= behavior[n] != CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
      }
    }
    if (!allowed) continue;
    int64_t index = -1;
    (void)cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &one,
                                   &index);

    Plan p;
    p.name = StrCat("engine ", index, mode == CUDNN_HEUR_MODE_FALLBACK ? " (fallback)" : "", " #",
                    plans_.size());
    ASSIGN_OR_RETURN(p.plan, BackendDescriptor::Create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR));
    cudnnBackendDescriptor_t d = p.plan.get();
    (void)cudnnBackendSetAttribute(d, kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle_);  // optional
    PSTRAIN_GRAPH_TRY(SetDescriptor(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[k]),
                      "plan configuration");
    // An engine the heuristics list may still not build for these shapes
    // or this device: skipped.
    if (cudnnBackendFinalize(d) != CUDNN_STATUS_SUCCESS) continue;
    int64_t workspace = 0;
    PSTRAIN_GRAPH_TRY(cudnnBackendGetAttribute(d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                               CUDNN_TYPE_INT64, 1, &one, &workspace),
                      "plan workspace");
    if (workspace < 0 || static_cast<size_t>(workspace) > workspace_limit) continue;
    p.workspace = static_cast<size_t>(workspace);
    p.config = std::move(configs[k]);
    plans_.push_back(std::move(p));
  }
  return Status::Ok();
}

StatusOr<BackendDescriptor> GraphConvolution::Bind(int i, void* x, void* w, void* y,
                                                   void* workspace) const {
  CHECK(i >= 0 && i < num_plans()) << where_ << ": no plan " << i;
  const std::string& where = where_;
  ASSIGN_OR_RETURN(BackendDescriptor pack,
                   BackendDescriptor::Create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR));
  void* pointers[3] = {x, w, y};
  const int64_t uids[3] = {kXUid, kWUid, kYUid};
  cudnnBackendDescriptor_t d = pack.get();
  PSTRAIN_GRAPH_TRY(cudnnBackendSetAttribute(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                             CUDNN_TYPE_VOID_PTR, 3, pointers),
                    "pack pointers");
  PSTRAIN_GRAPH_TRY(SetInt64s(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids, 3), "pack ids");
  PSTRAIN_GRAPH_TRY(cudnnBackendSetAttribute(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                             CUDNN_TYPE_VOID_PTR, 1, &workspace),
                    "pack workspace");
  PSTRAIN_GRAPH_TRY(cudnnBackendFinalize(d), "finalizing the pack");
  return pack;
}

Status GraphConvolution::Execute(int i, const BackendDescriptor& pack) const {
  const Plan& p = plans_.at(static_cast<size_t>(i));
  const std::string& where = where_;
  PSTRAIN_GRAPH_TRY(cudnnBackendExecute(handle_, p.plan.get(), pack.get()),
                    StrCat("running ", p.name));
  return Status::Ok();
}

void GraphConvolution::Choose(int i) {
  Plan chosen = std::move(plans_.at(static_cast<size_t>(i)));
  plans_.clear();
  plans_.push_back(std::move(chosen));
}

#undef PSTRAIN_GRAPH_TRY

}  // namespace pstrain::internal
