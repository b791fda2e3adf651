// The CUDA operators: convolution, pooling, batch norm, activations and the
// softmax through cuDNN; fully connected through cuBLAS; concat, add,
// dropout, flatten, the loss and the softmax gradient through copies and our
// kernels (nn/cuda/kernels.h). Each one's results are the CPU reference's
// (nn/cpu/reference_ops.cc) within float rounding, which the `gpu` tests
// check, with three documented differences: TF32 convolutions when
// BackendOptions::gpu_tf32 (PyTorch's default too), dropout masks drawn
// from a counter-based generator instead of the CPU's, and, for max pooling
// through cuDNN, which of several equal maxima of a window gets its gradient
// (see CudaPooling).
#include <algorithm>
#include <string>
#include <vector>

#include "nn/cuda/conv_choice.h"
#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cuda_check.h"
#include "nn/cuda/kernels.h"

namespace pstrain::internal {
namespace {

const float kOne = 1.0f, kZero = 0.0f;

// An invariant: the executor refuses a batch whose tensors pass
// MaxTensorElements (nn/backend.h) before any operator is made.
int CheckedInt(int64_t v, const char* what) {
  CHECK(v >= 0 && v <= INT32_MAX) << what << " " << v << " exceeds cuDNN's int dimensions";
  return static_cast<int>(v);
}

// A tensor's shape as cuDNN's NCHW: 4-d as it is, (N, C, rest...) as (N, C,
// rest, 1), so that what is per channel (batch norm) stays per channel; (N)
// as (N, 1, 1, 1).
struct Nchw {
  int n, c, h, w;
};
Nchw ToNchw(const Shape& s) {
  if (s.ndim() == 4) {
    return {CheckedInt(s[0], "N"), CheckedInt(s[1], "C"), CheckedInt(s[2], "H"),
            CheckedInt(s[3], "W")};
  }
  return {CheckedInt(s.ndim() > 0 ? s[0] : 1, "N"), CheckedInt(s.ndim() > 1 ? s[1] : 1, "C"),
          CheckedInt(s.ProductFrom(2), "H"), 1};
}

// Made at the first Set (planning or setup), so that an operator made
// without a device (Executor::PlanWithoutDevice) calls nothing in cuDNN.
class TensorDesc {
 public:
  TensorDesc() = default;
  ~TensorDesc() {
    if (d_) cudnnDestroyTensorDescriptor(d_);
  }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  void Set(const Nchw& s) {
    if (!d_) PSTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d_));
    PSTRAIN_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(d_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s.n, s.c, s.h, s.w));
  }
  void Set(const Shape& s) { Set(ToNchw(s)); }
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

// Base of the CUDA operators: the backend, kept at Setup.
class CudaOp : public Operator {
 public:
  explicit CudaOp(const Node& node) : Operator(node) {}

 protected:
  StatusOr<ScratchNeeds> DoPlanScratch(const OpContext& ctx) final {
    be_ = &CudaBackend::Of(ctx);
    return PlanCuda(ctx);
  }
  Status DoSetup(const OpContext& ctx) final { return SetupCuda(ctx); }
  // Sees shapes_ (nothing bound yet): kernels whose scratch depends on the
  // shapes choose here. SetupCuda sees t_.
  virtual StatusOr<ScratchNeeds> PlanCuda(const OpContext& ctx) { return ScratchNeeds{}; }
  virtual Status SetupCuda(const OpContext& ctx) { return Status::Ok(); }
  cudaStream_t stream() const { return be_->stream(); }
  cudnnHandle_t cudnn() const { return be_->cudnn(); }
  // cuDNN's and cuBLAS's beta for input i's gradient: 1 adds to it
  // (OpTensors::in_grad_add), 0 overwrites it.
  const float* Beta(size_t i) const { return AddsTo(i) ? &kOne : &kZero; }
  std::string Where() const { return StrCat(OpTypeName(node_.op), " '", node_.name, "'"); }
  // Device memory for this operator's own state (SetupCuda): ResourceExhausted
  // naming the operator, `what` and the bytes when the device is out of it
  // (a batch too large for the device is an error, not an abort).
  StatusOr<std::shared_ptr<Buffer>> TryBytes(size_t bytes, const char* what) const {
    return be_->TryAllocateBytes(bytes, StrCat(Where(), "'s ", what));
  }
  StatusOr<Tensor> TryEmpty(const Shape& shape, const char* what) const {
    ASSIGN_OR_RETURN(std::shared_ptr<Buffer> b,
                     TryBytes(static_cast<size_t>(shape.num_elements()) * sizeof(float), what));
    return Tensor(std::move(b), 0, shape);
  }

  CudaBackend* be_ = nullptr;
};

void CopyAsync(const Tensor& src, const Tensor& dst, cudaStream_t stream) {
  CHECK_EQ(src.num_elements(), dst.num_elements());
  if (src.data() == dst.data()) return;
  PSTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(dst.data(), src.data(), dst.bytes(), cudaMemcpyDeviceToDevice, stream));
}

// ---------------------------------------------------------------- convolution

class CudnnConvolution : public CudaOp {
 public:
  explicit CudnnConvolution(const Node& node) : CudaOp(node) {}
  ~CudnnConvolution() override {
    if (filter_) cudnnDestroyFilterDescriptor(filter_);
    if (conv_) cudnnDestroyConvolutionDescriptor(conv_);
  }
  bool CanAddToInputGradient(size_t i) const override { return true; }  // cuDNN's beta

 protected:
  // Descriptors and the algorithms (searched once per shape and backend) from
  // the shapes alone; the workspace the chosen algorithms need is this
  // operator's scratch, which the executor places in its arena for the
  // forward and the backward step (PyTorch's caching allocator gets the same
  // sharing by freeing each workspace after its call).
  StatusOr<ScratchNeeds> PlanCuda(const OpContext& ctx) override {
    const ConvParam& p = node_.conv;
    const Shape& xs = shapes_.in[0];
    const Shape& ys = shapes_.out;
    x_.Set(xs);
    y_.Set(ys);
    const Nchw w = ToNchw(shapes_.params[0]);
    PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnCreateFilterDescriptor(&filter_), Where());
    PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetFilter4dDescriptor(filter_, CUDNN_DATA_FLOAT,
                                                             CUDNN_TENSOR_NCHW, w.n, w.c, w.h, w.w),
                                  Where());
    PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnCreateConvolutionDescriptor(&conv_), Where());
    PSTRAIN_CUDNN_RETURN_IF_ERROR(
        cudnnSetConvolution2dDescriptor(conv_, p.pad_h, p.pad_w, p.stride_h, p.stride_w, 1, 1,
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
        Where());
    PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionGroupCount(conv_, p.num_group), Where());
    const bool tf32 = be_->options().gpu_tf32;
    PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(conv_, SearchMath()), Where());
    int n, c, h, wd;
    PSTRAIN_CUDNN_RETURN_IF_ERROR(
        cudnnGetConvolution2dForwardOutputDim(conv_, x_.get(), filter_, &n, &c, &h, &wd), Where());
    const Nchw y = ToNchw(ys);
    if (n != y.n || c != y.c || h != y.h || wd != y.w) {
      return Status::InvalidArgument(StrCat(Where(), ": cuDNN computes (", n, ",", c, ",", h, ",",
                                            wd, "), the graph ", ys.ToString()));
    }
    if (!p.no_bias) bias_.Set(Nchw{1, y.c, 1, 1});
    has_bwd_filter_ = shapes_.param_grads && shapes_.out_grad;
    has_bwd_data_ = has_bwd_filter_ && shapes_.in_grads[0];
    adds_ = has_bwd_data_ && !shapes_.in_grad_add.empty() && shapes_.in_grad_add[0];
    // (A graph plan has its beta built in, adding and writing are two plans;
    // the legacy algorithms take beta at the call and share one search.)
    const bool split_adds = adds_ && be_->options().gpu_conv_graph;
    const std::string key =
        StrCat(xs.ToString(), "*", shapes_.params[0].ToString(), "/", p.stride_h, ",", p.stride_w,
               "/", p.pad_h, ",", p.pad_w, "/g", p.num_group, tf32 ? "/tf32" : "/fp32", "/b",
               has_bwd_filter_ + has_bwd_data_, split_adds ? "/add" : "");
    auto& cache = be_->conv_algos();
    auto it = cache.find(key);
    if (it == cache.end()) {
      ConvAlgos found;
      RETURN_IF_ERROR(FindAlgorithms(&found));
      it = cache.emplace(key, found).first;
    }
    algos_ = it->second;
    ScratchNeeds needs;
    needs.forward_bytes = algos_.fwd.bytes;
    if (has_bwd_filter_) needs.backward_bytes = algos_.bwd_filter.bytes;
    if (has_bwd_data_) needs.backward_bytes = std::max(needs.backward_bytes, algos_.bwd_data.bytes);
    return needs;
  }

  // The graph plans' variant packs on the bound tensors.
  Status SetupCuda(const OpContext& ctx) override {
    if (algos_.fwd.graph) {
      ASSIGN_OR_RETURN(
          fwd_pack_, algos_.fwd.graph->Bind(0, t_.in[0].data(), t_.params[0].data(), t_.out.data(),
                                            Scratch(t_.scratch_forward)));
    }
    if (has_bwd_filter_ && algos_.bwd_filter.graph) {
      ASSIGN_OR_RETURN(bwd_filter_pack_, algos_.bwd_filter.graph->Bind(
                                             0, t_.in[0].data(), t_.param_grads[0].data(),
                                             t_.out_grad.data(), Scratch(t_.scratch_backward)));
    }
    if (has_bwd_data_ && algos_.bwd_data.graph) {
      ASSIGN_OR_RETURN(bwd_data_pack_, algos_.bwd_data.graph->Bind(
                                           0, t_.in_grads[0].data(), t_.params[0].data(),
                                           t_.out_grad.data(), Scratch(t_.scratch_backward)));
    }
    return Status::Ok();
  }

  void DoForward(const OpContext& ctx) override {
    if (algos_.fwd.graph) {
      CHECK_OK(algos_.fwd.graph->Execute(0, fwd_pack_));
    } else {
      PSTRAIN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, algos_.fwd.math));
      PSTRAIN_CUDNN_CHECK(LegacyForward(algos_.fwd.algo, t_.in[0].data(), t_.params[0].data(),
                                        t_.out.data(), Scratch(t_.scratch_forward),
                                        ScratchBytes(t_.scratch_forward)));
    }
    if (!node_.conv.no_bias) {
      PSTRAIN_CUDNN_CHECK(cudnnAddTensor(cudnn(), &kOne, bias_.get(), t_.params[1].data(), &kOne,
                                         y_.get(), t_.out.data()));
    }
  }

  void DoBackward(const OpContext& ctx) override {
    if (!has_bwd_filter_) return;
    void* ws = Scratch(t_.scratch_backward);
    const size_t ws_bytes = ScratchBytes(t_.scratch_backward);
    if (algos_.bwd_filter.graph) {
      CHECK_OK(algos_.bwd_filter.graph->Execute(0, bwd_filter_pack_));
    } else {
      PSTRAIN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, algos_.bwd_filter.math));
      PSTRAIN_CUDNN_CHECK(LegacyBackwardFilter(algos_.bwd_filter.algo, t_.in[0].data(),
                                               t_.out_grad.data(), t_.param_grads[0].data(), ws,
                                               ws_bytes));
    }
    if (!node_.conv.no_bias) {
      PSTRAIN_CUDNN_CHECK(cudnnConvolutionBackwardBias(cudnn(), &kOne, y_.get(), t_.out_grad.data(),
                                                       &kZero, bias_.get(),
                                                       t_.param_grads[1].data()));
    }
    if (has_bwd_data_ && algos_.bwd_data.graph) {
      CHECK_OK(algos_.bwd_data.graph->Execute(0, bwd_data_pack_));  // its beta is Beta(0)'s
    } else if (has_bwd_data_) {
      PSTRAIN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, algos_.bwd_data.math));
      PSTRAIN_CUDNN_CHECK(LegacyBackwardData(algos_.bwd_data.algo, t_.params[0].data(),
                                             t_.out_grad.data(), Beta(0), t_.in_grads[0].data(), ws,
                                             ws_bytes));
    }
  }

 private:
  static void* Scratch(const Tensor& t) { return t.defined() ? t.data() : nullptr; }
  static size_t ScratchBytes(const Tensor& t) { return t.defined() ? t.bytes() : 0; }

  // Each direction's legacy cuDNN call under `algo` (the caller sets its math
  // type): the step runs it on the bound tensors, the graph race on the
  // search buffers.
  cudnnStatus_t LegacyForward(cudnnConvolutionFwdAlgo_t algo, const void* x, const void* w, void* y,
                              void* ws, size_t ws_bytes) {
    return cudnnConvolutionForward(cudnn(), &kOne, x_.get(), x, filter_, w, conv_, algo, ws,
                                   ws_bytes, &kZero, y_.get(), y);
  }
  cudnnStatus_t LegacyBackwardFilter(cudnnConvolutionBwdFilterAlgo_t algo, const void* x,
                                     const void* dy, void* dw, void* ws, size_t ws_bytes) {
    return cudnnConvolutionBackwardFilter(cudnn(), &kOne, x_.get(), x, y_.get(), dy, conv_, algo,
                                          ws, ws_bytes, &kZero, filter_, dw);
  }
  // beta 1 adds to dx (a tensor read by other layers too), 0 writes it.
  cudnnStatus_t LegacyBackwardData(cudnnConvolutionBwdDataAlgo_t algo, const void* w,
                                   const void* dy, const float* beta, void* dx, void* ws,
                                   size_t ws_bytes) {
    return cudnnConvolutionBackwardData(cudnn(), &kOne, filter_, w, y_.get(), dy, conv_, algo, ws,
                                        ws_bytes, beta, x_.get(), dx);
  }

  // Device memory outside the caching allocator, for the search only (the
  // memory figures do not count it): freed when it goes, once the search's
  // stream is done with it (a search that fails midway may leave runs
  // queued), waited for with the backend's deadline. An error the stream
  // reports then is logged, not fatal: a failed search returns its own
  // status, which names the cuDNN call.
  struct SearchBuffer {
    explicit SearchBuffer(const CudaBackend* backend) : be(backend) {}
    SearchBuffer(const SearchBuffer&) = delete;
    SearchBuffer& operator=(const SearchBuffer&) = delete;
    const CudaBackend* be;
    void* p = nullptr;
    cudaStream_t stream = nullptr;
    ~SearchBuffer() {
      if (p == nullptr) return;
      if (stream != nullptr) {
        be->AwaitStream(stream, "cuDNN's algorithm search", /*cleanup=*/true);
      }
      cudaFree(p);
    }
    // Zeroed in `on`'s order (the search runs there).
    Status Allocate(size_t bytes, cudaStream_t on, const std::string& what) {
      const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        p = nullptr;
        const std::string why = StrCat(
            what, ": ", bytes, " bytes for cuDNN's algorithm search: ", cudaGetErrorString(e));
        return e == cudaErrorMemoryAllocation
                   ? Status::ResourceExhausted(StrCat(why, "; a smaller batch may fit"))
                   : Status::Unavailable(why);
      }
      stream = on;
      PSTRAIN_CUDA_CHECK(cudaMemsetAsync(p, 0, std::max<size_t>(bytes, 1), stream));
      return Status::Ok();
    }
  };

  // cuDNN's measured search (PyTorch's benchmark mode), run once per shape on
  // zeroed buffers of the shapes and a workspace of the configured limit (both
  // freed after it). The fastest algorithm within the limit wins.
  Status FindAlgorithms(ConvAlgos* out) {
    const auto bytes = [](const Shape& s) {
      return static_cast<size_t>(s.num_elements()) * sizeof(float);
    };
    // x doubles as dx (the backward-data search reads w and dy only), y as
    // dy; dw is its own (the backward-filter search reads x and dy).
    SearchBuffer x(be_), w(be_), y(be_), dw(be_);
    RETURN_IF_ERROR(x.Allocate(bytes(shapes_.in[0]), stream(), Where()));
    RETURN_IF_ERROR(w.Allocate(bytes(shapes_.params[0]), stream(), Where()));
    RETURN_IF_ERROR(y.Allocate(bytes(shapes_.out), stream(), Where()));
    if (has_bwd_filter_) RETURN_IF_ERROR(dw.Allocate(bytes(shapes_.params[0]), stream(), Where()));
    size_t limit = be_->options().gpu_workspace_bytes;
    SearchBuffer ws(be_);
    ws.stream = stream();
    while (limit > 0 && cudaMalloc(&ws.p, limit) != cudaSuccess) {
      (void)cudaGetLastError();
      ws.p = nullptr;
      limit /= 2;
    }
    int got = 0;
    {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnFindConvolutionForwardAlgorithmEx(
                                        cudnn(), x_.get(), x.p, filter_, w.p, conv_, y_.get(), y.p,
                                        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf, ws.p, limit),
                                    StrCat(Where(), ": searching forward algorithms"));
      RETURN_IF_ERROR(Pick(perf, got, limit, "forward", &out->fwd));
      RETURN_IF_ERROR(CoverWorkspace("forward", &out->fwd, [&](size_t* need) {
        return cudnnGetConvolutionForwardWorkspaceSize(cudnn(), x_.get(), filter_, conv_, y_.get(),
                                                       out->fwd.algo, need);
      }));
      RETURN_IF_ERROR(
          RaceGraph(ConvDirection::kForward, 0.0f, x.p, w.p, y.p, ws.p, limit, &out->fwd,
                    [&] { return LegacyForward(out->fwd.algo, x.p, w.p, y.p, ws.p, limit); }));
    }
    if (!has_bwd_filter_) return Status::Ok();  // inference: no backward
    {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      PSTRAIN_CUDNN_RETURN_IF_ERROR(
          cudnnFindConvolutionBackwardFilterAlgorithmEx(
              cudnn(), x_.get(), x.p, y_.get(), y.p, conv_, filter_, dw.p,
              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, perf, ws.p, limit),
          StrCat(Where(), ": searching backward-filter algorithms"));
      RETURN_IF_ERROR(Pick(perf, got, limit, "backward filter", &out->bwd_filter));
      RETURN_IF_ERROR(CoverWorkspace("backward filter", &out->bwd_filter, [&](size_t* need) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn(), x_.get(), y_.get(), conv_,
                                                              filter_, out->bwd_filter.algo, need);
      }));
      RETURN_IF_ERROR(RaceGraph(
          ConvDirection::kBackwardFilter, 0.0f, x.p, dw.p, y.p, ws.p, limit, &out->bwd_filter,
          [&] { return LegacyBackwardFilter(out->bwd_filter.algo, x.p, y.p, dw.p, ws.p, limit); }));
    }
    if (has_bwd_data_) {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      PSTRAIN_CUDNN_RETURN_IF_ERROR(
          cudnnFindConvolutionBackwardDataAlgorithmEx(
              cudnn(), filter_, w.p, y_.get(), y.p, conv_, x_.get(), x.p,
              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, perf, ws.p, limit),
          StrCat(Where(), ": searching backward-data algorithms"));
      RETURN_IF_ERROR(Pick(perf, got, limit, "backward data", &out->bwd_data));
      RETURN_IF_ERROR(CoverWorkspace("backward data", &out->bwd_data, [&](size_t* need) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn(), filter_, y_.get(), conv_,
                                                            x_.get(), out->bwd_data.algo, need);
      }));
      const float* beta = adds_ ? &kOne : &kZero;
      RETURN_IF_ERROR(RaceGraph(
          ConvDirection::kBackwardData, *beta, x.p, w.p, y.p, ws.p, limit, &out->bwd_data, [&] {
            return LegacyBackwardData(out->bwd_data.algo, w.p, y.p, beta, x.p, ws.p, limit);
          }));
    }
    return Status::Ok();
  }

  // With BackendOptions::gpu_conv_graph: the graph API's plans for this
  // direction (nn/cuda/cudnn_graph.h), timed on the search buffers against
  // the legacy choice `c` (run by `legacy`, a cuDNN call under c's math); the
  // fastest wins unless one within the timing's noise needs less workspace
  // (cuda::ChooseTimed, the rule of the legacy search's Pick). A direction the graph API cannot
  // build keeps the legacy algorithm, with a warning naming why.
  template <typename Algo, typename Legacy>
  Status RaceGraph(ConvDirection direction, float beta, void* x, void* w, void* y, void* ws,
                   size_t limit, ConvChoice<Algo>* c, Legacy legacy) {
    if (!be_->options().gpu_conv_graph) return Status::Ok();
    if (c->bytes > limit) {
      // cuDNN's size query under the run's math asked for more than the
      // search's whole workspace (CoverWorkspace): the legacy algorithm cannot
      // run on the search buffers to be timed, but runs in the step.
      LOG(WARNING) << Where() << ": the legacy " << ConvDirectionName(direction)
                   << " algorithm needs " << c->bytes << " bytes of workspace, more than the "
                   << limit << " of the search; it runs without racing the graph API";
      be_->CountConvSearch(CudaBackend::ConvSearch::kGraphUnavailable);
      return Status::Ok();
    }
    const Nchw xs = ToNchw(shapes_.in[0]), wsh = ToNchw(shapes_.params[0]),
               ys = ToNchw(shapes_.out);
    const ConvParam& p = node_.conv;
    const ConvGeometry g{{xs.n, xs.c, xs.h, xs.w},
                         {wsh.n, wsh.c, wsh.h, wsh.w},
                         {ys.n, ys.c, ys.h, ys.w},
                         {p.pad_h, p.pad_w},
                         {p.stride_h, p.stride_w}};
    auto made = GraphConvolution::Create(cudnn(), direction, g, beta);
    Status listed = made.status();
    if (listed.ok()) listed = (*made)->ListPlans(be_->options().gpu_tf32, limit, kGraphPlans);
    if (listed.ok() && (*made)->num_plans() == 0) {
      listed = Status::NotFound(StrCat("no engine of cuDNN's heuristics builds the ",
                                       ConvDirectionName(direction), " pass within ", limit,
                                       " bytes of workspace"));
    }
    if (!listed.ok()) {
      LOG(WARNING) << Where() << ": " << listed << "; the legacy algorithm runs";
      be_->CountConvSearch(CudaBackend::ConvSearch::kGraphUnavailable);
      return Status::Ok();
    }
    GraphConvolution& graph = **made;
    StatusOr<float> legacy_ms = TimeMs([&] {
      PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(conv_, c->math), Where());
      const cudnnStatus_t s = legacy();
      PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(conv_, SearchMath()), Where());
      PSTRAIN_CUDNN_RETURN_IF_ERROR(
          s, StrCat(Where(), ": the legacy ", ConvDirectionName(direction), " algorithm"));
      return Status::Ok();
    });
    RETURN_IF_ERROR(legacy_ms.status());
    // Candidates: the legacy choice, then each plan that ran (plan_of[k]: its
    // plan index); Pick's rule decides, so a plan must be more than the
    // timing's noise faster to take more workspace than the legacy choice.
    std::vector<cuda::TimedAlgorithm> timed = {{*legacy_ms, c->bytes}};
    std::vector<int> plan_of = {-1};
    for (int i = 0; i < graph.num_plans(); ++i) {
      // The pack made once, so that only the plan's own work is timed.
      StatusOr<BackendDescriptor> pack = graph.Bind(i, x, w, y, ws);
      StatusOr<float> ms = pack.ok() ? TimeMs([&] { return graph.Execute(i, *pack); })
                                     : StatusOr<float>(pack.status());
      if (!ms.ok()) {
        VLOG(1) << Where() << ": " << ms.status();
        continue;
      }
      timed.push_back({*ms, graph.workspace_bytes(i)});
      plan_of.push_back(i);
    }
    if (be_->options().gpu_conv_graph_preferred && timed.size() > 1) {
      timed.erase(timed.begin());  // a graph plan whenever one runs (tests)
      plan_of.erase(plan_of.begin());
    }
    const int chosen = cuda::ChooseTimed(timed);
    const int best = plan_of[chosen];
    be_->CountConvSearch(best >= 0 ? CudaBackend::ConvSearch::kGraphFaster
                                   : CudaBackend::ConvSearch::kLegacyFaster);
    if (best < 0) return Status::Ok();
    graph.Choose(best);
    VLOG(1) << Where() << " " << ConvDirectionName(direction) << ": " << graph.chosen_name() << " ("
            << timed[chosen].ms << " ms, " << timed[chosen].workspace
            << " bytes) over legacy algorithm " << c->algo << " (" << *legacy_ms << " ms, "
            << c->bytes << " bytes)";
    c->bytes = graph.chosen_workspace_bytes();
    c->graph = std::shared_ptr<GraphConvolution>(std::move(made).value());
    return Status::Ok();
  }

  // Device time of `run` on the compute stream: the median of three timed
  // runs after an untimed one, in milliseconds.
  template <typename Run>
  StatusOr<float> TimeMs(Run run) {
    RETURN_IF_ERROR(run());
    float ms[3];
    for (float& m : ms) {
      be_->StartTiming();
      RETURN_IF_ERROR(run());
      m = static_cast<float>(be_->StopTiming() * 1e3);
    }
    std::sort(ms, ms + 3);
    return ms[1];
  }

  // Whether a search result may run: never with a conversion to half
  // precision, and with tensor-op math (TF32 for float data) only where TF32
  // is allowed.
  bool MathAllowed(cudnnMathType_t math) const {
    if (math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
    return be_->options().gpu_tf32 || math != CUDNN_TENSOR_OP_MATH;
  }
  // The math a result runs under: its own with TF32 allowed, else FMA (the
  // search's, which keeps tensor cores out).
  cudnnMathType_t RunMath(cudnnMathType_t found) const {
    return be_->options().gpu_tf32 ? found : CUDNN_FMA_MATH;
  }

  // The choice's workspace: the larger of the search's figure and cuDNN's
  // size query (`query(&bytes)`) for the algorithm under the math it will run
  // with, so the planned scratch covers the kernel that runs. The descriptor
  // is back at the search's math afterwards.
  template <typename Algo, typename Query>
  Status CoverWorkspace(const char* which, ConvChoice<Algo>* c, Query query) {
    PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(conv_, c->math), Where());
    size_t need = 0;
    const cudnnStatus_t status = query(&need);
    PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(conv_, SearchMath()), Where());
    PSTRAIN_CUDNN_RETURN_IF_ERROR(
        status, StrCat(Where(), ": the workspace of the chosen ", which, " algorithm"));
    c->bytes = std::max(c->bytes, need);
    return Status::Ok();
  }
  cudnnMathType_t SearchMath() const {
    return be_->options().gpu_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  }

  // The fastest algorithm within the limit, unless one at most 3% slower
  // (about the search's own timing noise) needs less workspace
  // (cuda::ChooseTimed): the workspace is planned memory, and a large one can
  // grow the arena (LeNet at batch 512 held about 150 MB of workspace against
  // 53 MB of planned activations while it was one buffer outside the plan).
  template <typename Perf, typename Algo>
  Status Pick(const Perf* perf, int got, size_t limit, const char* which, ConvChoice<Algo>* c) {
    std::vector<cuda::TimedAlgorithm> timed;
    std::vector<int> index;  // into perf
    for (int i = 0; i < got; ++i) {
      if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > limit ||
          !MathAllowed(perf[i].mathType)) {
        continue;
      }
      timed.push_back({perf[i].time, perf[i].memory});
      index.push_back(i);
    }
    const int chosen = cuda::ChooseTimed(timed);
    const int best = chosen < 0 ? -1 : index[chosen];
    if (best < 0) {
      return Status::Unavailable(StrCat(Where(), ": no cuDNN ", which, " algorithm runs within ",
                                        limit, " bytes of workspace"));
    }
    c->algo = perf[best].algo;
    c->math = RunMath(perf[best].mathType);
    c->bytes = perf[best].memory;
    return Status::Ok();
  }

  TensorDesc x_, y_, bias_;
  cudnnFilterDescriptor_t filter_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  static constexpr int kGraphPlans = 8;  // timed per direction, in the heuristics' order

  ConvAlgos algos_{};
  bool has_bwd_filter_ = false, has_bwd_data_ = false;
  bool adds_ = false;  // the backward data adds to the input's gradient
  BackendDescriptor fwd_pack_, bwd_filter_pack_, bwd_data_pack_;  // graph plans' (SetupCuda)
};

// -------------------------------------------------------------------- pooling

class CudaPooling : public CudaOp {
 public:
  explicit CudaPooling(const Node& node) : CudaOp(node) {}
  ~CudaPooling() override {
    if (pool_) cudnnDestroyPoolingDescriptor(pool_);
  }
  // cuDNN's backward reads both; ours neither (max pooling reads the maxima
  // its forward recorded). Without the input shapes, as cuDNN's.
  bool BackwardNeedsInputs() const override { return !ours_; }
  bool BackwardNeedsOutput() const override { return !ours_; }
  bool CanAddToInputGradient(size_t i) const override { return true; }  // cuDNN's beta, ours

 protected:
  void DoLearnInputShapes(const std::vector<Shape>& in) override {
    if (in.size() != 1 || in[0].ndim() != 3 || node_.out_shape.ndim() != 3) return;  // Setup says
    const Shape& x = in[0];
    const Shape& y = node_.out_shape;
    ours_ = !cuda::CudnnPoolingFits(
        cuda::PoolArgsOf(node_.pool, Shape{1, x[0], x[1], x[2]}, Shape{1, y[0], y[1], y[2]}));
  }

  Status SetupCuda(const OpContext& ctx) override {
    const Shape& xs = t_.in[0].shape();
    const Shape& ys = t_.out.shape();
    args_ = cuda::PoolArgsOf(node_.pool, xs, ys);
    x_.Set(xs);
    y_.Set(ys);
    // Ties: the reference (and our kernels, pool_kernels.h) give a window's
    // gradient to its first maximum in row-major order. cuDNN documents no
    // rule for equal maxima (only that this mode's backward is
    // deterministic), so where a window holds its maximum twice the input
    // gradient may differ from the reference's: another element may get it,
    // or several may. Training is not affected where the ties are a ReLU's
    // zeros (the ReLU's backward zeroes those elements' gradients anyway),
    // and ties of other floats are rare; the op tests compare max pooling on
    // distinct inputs (OpCase::distinct_inputs) for this reason.
    PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnCreatePoolingDescriptor(&pool_), Where());
    PSTRAIN_CUDNN_RETURN_IF_ERROR(
        cudnnSetPooling2dDescriptor(pool_,
                                    args_.is_max ? CUDNN_POOLING_MAX_DETERMINISTIC
                                                 : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                                    CUDNN_NOT_PROPAGATE_NAN, args_.kernel_h, args_.kernel_w,
                                    args_.pad_h, args_.pad_w, args_.stride_h, args_.stride_w),
        Where());
    // cuDNN's windows are the reference's unless MXNet's "full" rounding adds
    // an output whose window spills past the padding: then our kernels.
    int n, c, h, w;
    PSTRAIN_CUDNN_RETURN_IF_ERROR(
        cudnnGetPooling2dForwardOutputDim(pool_, x_.get(), &n, &c, &h, &w), Where());
    // One rule decides, the plan's (DoLearnInputShapes) and this one: cuDNN's
    // own output size must agree with it.
    use_cudnn_ = cuda::CudnnPoolingFits(args_);
    if (use_cudnn_ != (h == args_.OH && w == args_.OW)) {
      return Status::Internal(StrCat(Where(), ": cuDNN pools ", args_.H, "x", args_.W, " into ", h,
                                     "x", w, ", where CudnnPoolingFits says ",
                                     use_cudnn_ ? "it has" : "it lacks", " the windows of ",
                                     args_.OH, "x", args_.OW));
    }
    if (!use_cudnn_ && args_.is_max) {
      if (args_.H * args_.W > INT32_MAX) {
        return Status::InvalidArgument(
            StrCat(Where(), ": a plane of ", args_.H, "x", args_.W, " exceeds 2^31 elements"));
      }
      ASSIGN_OR_RETURN(argmax_,
                       TryBytes(static_cast<size_t>(t_.out.num_elements()) * sizeof(int32_t),
                                "maxima (argmax)"));
    }
    return Status::Ok();
  }

  void DoForward(const OpContext& ctx) override {
    if (use_cudnn_) {
      PSTRAIN_CUDNN_CHECK(cudnnPoolingForward(cudnn(), pool_, &kOne, x_.get(), t_.in[0].data(),
                                              &kZero, y_.get(), t_.out.data()));
    } else {
      cuda::PoolForward(args_, t_.in[0].data(), t_.out.data(), Argmax(), stream());
    }
  }

  void DoBackward(const OpContext& ctx) override {
    if (!t_.in_grads[0].defined()) return;
    if (use_cudnn_) {
      PSTRAIN_CUDNN_CHECK(cudnnPoolingBackward(
          cudnn(), pool_, &kOne, y_.get(), t_.out.data(), y_.get(), t_.out_grad.data(), x_.get(),
          t_.in[0].data(), Beta(0), x_.get(), t_.in_grads[0].data()));
    } else {
      cuda::PoolBackward(args_, Argmax(), t_.out_grad.data(), t_.in_grads[0].data(), AddsTo(0),
                         stream());
    }
  }

 private:
  int32_t* Argmax() const {
    return argmax_ ? reinterpret_cast<int32_t*>(argmax_->data()) : nullptr;
  }

  TensorDesc x_, y_;
  cudnnPoolingDescriptor_t pool_ = nullptr;
  cuda::PoolArgs args_{};
  bool use_cudnn_ = true;
  // Our kernels run (decided from the input shapes, before planning): the
  // backward keeps neither the input nor the output.
  bool ours_ = false;
  // Our max pooling's record of each window's first maximum, from the forward
  // to the backward (NC * OH * OW offsets within the plane).
  std::shared_ptr<Buffer> argmax_;
};

// ------------------------------------------------------------ fully connected

// Row-major x (N, K), W (M, K), y (N, M) are column-major x^T, W^T, y^T to
// cuBLAS:  y^T = W x^T,  dx^T = W^T dy^T,  dW^T = x^T dy,  db = dy^T 1.
class CublasFullyConnected : public CudaOp {
 public:
  explicit CublasFullyConnected(const Node& node) : CudaOp(node) {}
  bool CanAddToInputGradient(size_t i) const override { return true; }  // cuBLAS's beta

 protected:
  Status SetupCuda(const OpContext& ctx) override {
    N_ = CheckedInt(t_.in[0].shape()[0], "batch");
    K_ = CheckedInt(t_.in[0].shape().ProductFrom(1), "input features");
    M_ = CheckedInt(node_.fc.num_hidden, "num_hidden");
    if (!node_.fc.no_bias) {
      ASSIGN_OR_RETURN(ones_, TryEmpty(Shape{N_}, "ones for the bias gradient"));
      be_->Fill(ones_, 1.0f);
    }
    return Status::Ok();
  }

  void DoForward(const OpContext& ctx) override {
    PSTRAIN_CUBLAS_CHECK(cublasSgemm(be_->cublas(), CUBLAS_OP_T, CUBLAS_OP_N, M_, N_, K_, &kOne,
                                     t_.params[0].data(), K_, t_.in[0].data(), K_, &kZero,
                                     t_.out.data(), M_));
    if (!node_.fc.no_bias) cuda::AddBias(t_.params[1].data(), t_.out.data(), N_, M_, stream());
  }

  void DoBackward(const OpContext& ctx) override {
    const float* dy = t_.out_grad.data();
    PSTRAIN_CUBLAS_CHECK(cublasSgemm(be_->cublas(), CUBLAS_OP_N, CUBLAS_OP_T, K_, M_, N_, &kOne,
                                     t_.in[0].data(), K_, dy, M_, &kZero, t_.param_grads[0].data(),
                                     K_));
    if (!node_.fc.no_bias) {
      PSTRAIN_CUBLAS_CHECK(cublasSgemv(be_->cublas(), CUBLAS_OP_N, M_, N_, &kOne, dy, M_,
                                       ones_.data(), 1, &kZero, t_.param_grads[1].data(), 1));
    }
    if (t_.in_grads[0].defined()) {
      PSTRAIN_CUBLAS_CHECK(cublasSgemm(be_->cublas(), CUBLAS_OP_N, CUBLAS_OP_N, K_, N_, M_, &kOne,
                                       t_.params[0].data(), K_, dy, M_, Beta(0),
                                       t_.in_grads[0].data(), K_));
    }
  }

 private:
  int N_ = 0, K_ = 0, M_ = 0;
  Tensor ones_;  // N ones: the bias gradient sums dy's rows with them
};

// ----------------------------------------------------------------- batch norm

class CudnnBatchNorm : public CudaOp {
 public:
  explicit CudnnBatchNorm(const Node& node) : CudaOp(node) {}
  bool CanAddToInputGradient(size_t i) const override { return true; }  // cuDNN's beta

 protected:
  // cuDNN always writes dx: where no gradient of the input is wanted (a batch
  // norm on the data), the backward writes it to its scratch.
  StatusOr<ScratchNeeds> PlanCuda(const OpContext& ctx) override {
    ScratchNeeds needs;
    if (shapes_.out_grad && !shapes_.in_grads[0]) {
      needs.backward_bytes = static_cast<size_t>(shapes_.in[0].num_elements()) * sizeof(float);
    }
    return needs;
  }

  Status SetupCuda(const OpContext& ctx) override {
    // Per channel (dimension 1) over the batch and every later dimension, as
    // the CPU's.
    const Nchw s = ToNchw(t_.in[0].shape());
    x_.Set(s);
    stats_.Set(Nchw{1, s.c, 1, 1});
    C_ = s.c;
    // cuDNN 9 takes any epsilon >= CUDNN_BN_MIN_EPSILON (0); older ones
    // wanted 1e-5, which would change the 2015 models' 1e-10 + 1e-5 slightly.
    eps_ = std::max(static_cast<double>(node_.bn.eps), static_cast<double>(CUDNN_BN_MIN_EPSILON));
    ASSIGN_OR_RETURN(saved_mean_, TryEmpty(Shape{C_}, "saved mean"));
    ASSIGN_OR_RETURN(saved_invstd_, TryEmpty(Shape{C_}, "saved inverse deviation"));
    if (node_.bn.fix_gamma) {
      ASSIGN_OR_RETURN(ones_, TryEmpty(Shape{C_}, "fixed gamma"));
      be_->Fill(ones_, 1.0f);
      ASSIGN_OR_RETURN(dgamma_scratch_, TryEmpty(Shape{C_}, "gamma gradient scratch"));
    }
    return Status::Ok();
  }

  void DoForward(const OpContext& ctx) override {
    const float* gamma = node_.bn.fix_gamma ? ones_.data() : t_.params[0].data();
    if (ctx.is_train) {
      // No running averages from cuDNN (it folds in the unbiased variance);
      // ours fold in the biased one, as the CPU and MXNet do.
      PSTRAIN_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
          cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, x_.get(), t_.in[0].data(), x_.get(),
          t_.out.data(), stats_.get(), gamma, t_.params[1].data(), 0.0, nullptr, nullptr, eps_,
          saved_mean_.data(), saved_invstd_.data()));
      cuda::BatchNormMovingStats(saved_mean_.data(), saved_invstd_.data(), static_cast<float>(eps_),
                                 node_.bn.momentum, t_.aux[0].data(), t_.aux[1].data(), C_,
                                 stream());
    } else {
      PSTRAIN_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
          cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, x_.get(), t_.in[0].data(), x_.get(),
          t_.out.data(), stats_.get(), gamma, t_.params[1].data(), t_.aux[0].data(),
          t_.aux[1].data(), eps_));
    }
  }

  void DoBackward(const OpContext& ctx) override {
    const bool fix = node_.bn.fix_gamma;
    const float* gamma = fix ? ones_.data() : t_.params[0].data();
    float* dgamma = fix ? dgamma_scratch_.data() : t_.param_grads[0].data();
    float* dx = t_.in_grads[0].defined() ? t_.in_grads[0].data() : t_.scratch_backward.data();
    PSTRAIN_CUDNN_CHECK(cudnnBatchNormalizationBackward(
        cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, Beta(0), &kOne, &kZero, x_.get(), t_.in[0].data(),
        x_.get(), t_.out_grad.data(), x_.get(), dx, stats_.get(), gamma, dgamma,
        t_.param_grads[1].data(), eps_, saved_mean_.data(), saved_invstd_.data()));
    if (fix) be_->Fill(t_.param_grads[0], 0.0f);  // gamma is held at 1
  }

 private:
  TensorDesc x_, stats_;
  int64_t C_ = 0;
  double eps_ = 0;
  Tensor saved_mean_, saved_invstd_, ones_, dgamma_scratch_;
};

// ---------------------------------------------------------------- activations

// Backward from the output alone: relu's mask, tanh's 1 - y^2 and sigmoid's
// y (1 - y) need only y, so y is handed to cuDNN as x too and the planner may
// reuse the input's memory.
class CudnnActivation : public CudaOp {
 public:
  explicit CudnnActivation(const Node& node) : CudaOp(node) {}
  ~CudnnActivation() override {
    if (act_) cudnnDestroyActivationDescriptor(act_);
  }
  bool BackwardNeedsInputs() const override { return false; }
  bool BackwardNeedsOutput() const override { return true; }
  // cuDNN's activation runs in place both ways (y over x, dx over dy, same
  // descriptors), as the CPU's does: the planner then keeps one tensor per
  // batch norm + relu pair, not two (ResNet-50 at batch 32: about 540 MB less).
  bool CanRunInPlace() const override { return true; }
  bool CanAddToInputGradient(size_t i) const override { return true; }  // cuDNN's beta

 protected:
  Status SetupCuda(const OpContext& ctx) override {
    x_.Set(t_.in[0].shape());
    cudnnActivationMode_t mode = CUDNN_ACTIVATION_RELU;
    if (node_.act == ActType::kTanh) mode = CUDNN_ACTIVATION_TANH;
    if (node_.act == ActType::kSigmoid) mode = CUDNN_ACTIVATION_SIGMOID;
    PSTRAIN_CUDNN_RETURN_IF_ERROR(cudnnCreateActivationDescriptor(&act_), Where());
    PSTRAIN_CUDNN_RETURN_IF_ERROR(
        cudnnSetActivationDescriptor(act_, mode, CUDNN_NOT_PROPAGATE_NAN, 0.0), Where());
    return Status::Ok();
  }

  void DoForward(const OpContext& ctx) override {
    PSTRAIN_CUDNN_CHECK(cudnnActivationForward(cudnn(), act_, &kOne, x_.get(), t_.in[0].data(),
                                               &kZero, x_.get(), t_.out.data()));
  }

  void DoBackward(const OpContext& ctx) override {
    if (!t_.in_grads[0].defined()) return;
    PSTRAIN_CUDNN_CHECK(cudnnActivationBackward(
        cudnn(), act_, &kOne, x_.get(), t_.out.data(), x_.get(), t_.out_grad.data(), x_.get(),
        t_.out.data(), Beta(0), x_.get(), t_.in_grads[0].data()));
  }

 private:
  TensorDesc x_;
  cudnnActivationDescriptor_t act_ = nullptr;
};

// ------------------------------------------------------------- softmax output

class CudnnSoftmaxOutput : public CudaOp {
 public:
  explicit CudnnSoftmaxOutput(const Node& node) : CudaOp(node) {}
  bool BackwardNeedsOutput() const override { return true; }

  float Loss() const override {
    if (loss_.num_elements() == 0) return 0.0f;
    std::vector<float> host(static_cast<size_t>(loss_.num_elements()));
    be_->CopyToHost(loss_, host.data());
    double sum = 0;
    for (float v : host) sum += v;
    return static_cast<float>(sum / static_cast<double>(host.size()));
  }

 protected:
  Status SetupCuda(const OpContext& ctx) override {
    N_ = t_.out.shape()[0];
    K_ = t_.out.shape().ProductFrom(1);
    x_.Set(Nchw{CheckedInt(N_, "batch"), CheckedInt(K_, "classes"), 1, 1});
    ASSIGN_OR_RETURN(loss_, TryEmpty(Shape{N_}, "per-example loss"));
    be_->Fill(loss_, 0.0f);
    return Status::Ok();
  }

  void DoForward(const OpContext& ctx) override {
    PSTRAIN_CUDNN_CHECK(cudnnSoftmaxForward(cudnn(), CUDNN_SOFTMAX_ACCURATE,
                                            CUDNN_SOFTMAX_MODE_INSTANCE, &kOne, x_.get(),
                                            t_.in[0].data(), &kZero, x_.get(), t_.out.data()));
    cuda::SoftmaxLoss(t_.out.data(), t_.in[1].data(), loss_.data(), N_, K_, stream());
  }

  void DoBackward(const OpContext& ctx) override {
    if (!t_.in_grads[0].defined()) return;
    cuda::SoftmaxOutputBackward(t_.out.data(), t_.in[1].data(), t_.in_grads[0].data(), N_, K_,
                                node_.softmax_grad_scale, stream());
  }

 private:
  TensorDesc x_;
  int64_t N_ = 0, K_ = 0;
  Tensor loss_;  // per example, of the last forward
};

// ------------------------------------------- concat, add, dropout, flatten

// Channel concat of (N, C_j, ...) inputs: one strided 2-D copy per input.
class CudaConcat : public CudaOp {
 public:
  explicit CudaConcat(const Node& node) : CudaOp(node) {}
  bool BackwardNeedsInputs() const override { return false; }

 protected:
  void DoForward(const OpContext& ctx) override { Run(/*forward=*/true); }
  void DoBackward(const OpContext& ctx) override { Run(/*forward=*/false); }

 private:
  void Run(bool forward) {
    const int64_t N = t_.out.shape()[0];
    const size_t out_row = static_cast<size_t>(t_.out.shape().ProductFrom(1)) * sizeof(float);
    size_t offset = 0;
    for (size_t j = 0; j < t_.in.size(); ++j) {
      const size_t row = static_cast<size_t>(t_.in[j].shape().ProductFrom(1)) * sizeof(float);
      char* whole = reinterpret_cast<char*>(forward ? t_.out.data() : t_.out_grad.data()) + offset;
      offset += row;
      if (forward) {
        PSTRAIN_CUDA_CHECK(cudaMemcpy2DAsync(whole, out_row, t_.in[j].data(), row, row, N,
                                             cudaMemcpyDeviceToDevice, stream()));
      } else if (t_.in_grads[j].defined()) {
        PSTRAIN_CUDA_CHECK(cudaMemcpy2DAsync(t_.in_grads[j].data(), row, whole, out_row, row, N,
                                             cudaMemcpyDeviceToDevice, stream()));
      }
    }
  }
};

class CudaAdd : public CudaOp {
 public:
  explicit CudaAdd(const Node& node) : CudaOp(node) {}
  bool BackwardNeedsInputs() const override { return false; }
  // As the CPU's: the sum may overwrite its first input, whose gradient is
  // then the output's gradient itself (no copy).
  bool CanRunInPlace() const override { return true; }
  bool CanAddToInputGradient(size_t i) const override { return true; }

 protected:
  void DoForward(const OpContext& ctx) override {
    const int64_t n = t_.out.num_elements();
    size_t k = 1;
    if (t_.in[0].data() == t_.out.data()) {
      // in place: out holds in[0] already
    } else if (t_.in.size() == 1) {
      CopyAsync(t_.in[0], t_.out, stream());
    } else {
      cuda::Add2(t_.in[0].data(), t_.in[1].data(), t_.out.data(), n, stream());
      k = 2;
    }
    for (; k < t_.in.size(); ++k) cuda::Add(t_.in[k].data(), t_.out.data(), n, stream());
  }
  void DoBackward(const OpContext& ctx) override {
    const int64_t n = t_.out_grad.num_elements();
    for (size_t k = 0; k < t_.in_grads.size(); ++k) {
      const Tensor& g = t_.in_grads[k];
      if (!g.defined() || g.data() == t_.out_grad.data()) continue;  // in place: it is dy
      if (AddsTo(k)) {
        cuda::Add(t_.out_grad.data(), g.data(), n, stream());
      } else {
        CopyAsync(t_.out_grad, g, stream());
      }
    }
  }
};

class CudaDropout : public CudaOp {
 public:
  explicit CudaDropout(const Node& node) : CudaOp(node) {}
  bool BackwardNeedsInputs() const override { return false; }

 protected:
  Status SetupCuda(const OpContext& ctx) override {
    if (ctx.rng == nullptr) {
      return Status::InvalidArgument(StrCat(Where(), " needs a random generator"));
    }
    ASSIGN_OR_RETURN(mask_, TryBytes(static_cast<size_t>(t_.out.num_elements()), "mask"));
    return Status::Ok();
  }

  void DoForward(const OpContext& ctx) override {
    masked_ = ctx.is_train && node_.dropout.p > 0.0f;
    if (!masked_) {
      CopyAsync(t_.in[0], t_.out, stream());
      return;
    }
    cuda::DropoutForward(t_.in[0].data(), t_.out.data(), Mask(), t_.out.num_elements(),
                         node_.dropout.p, (*ctx.rng)(), stream());
  }

  void DoBackward(const OpContext& ctx) override {
    if (!t_.in_grads[0].defined()) return;
    if (!masked_) {
      CopyAsync(t_.out_grad, t_.in_grads[0], stream());
      return;
    }
    cuda::DropoutBackward(t_.out_grad.data(), Mask(), t_.in_grads[0].data(), t_.out.num_elements(),
                          node_.dropout.p, stream());
  }

 private:
  uint8_t* Mask() const { return reinterpret_cast<uint8_t*>(mask_->data()); }
  std::shared_ptr<Buffer> mask_;  // one byte per element: kept or not
  bool masked_ = false;           // the last forward drew a mask
};

class CudaFlatten : public CudaOp {
 public:
  explicit CudaFlatten(const Node& node) : CudaOp(node) {}
  bool BackwardNeedsInputs() const override { return false; }

 protected:
  void DoForward(const OpContext& ctx) override { CopyAsync(t_.in[0], t_.out, stream()); }
  void DoBackward(const OpContext& ctx) override {
    if (t_.in_grads[0].defined()) CopyAsync(t_.out_grad, t_.in_grads[0], stream());
  }
};

}  // namespace

StatusOr<std::unique_ptr<Operator>> MakeCudaOperator(const Node& node) {
  switch (node.op) {
    case OpType::kInput:
      return Status::InvalidArgument(StrCat("node '", node.name, "' is an input, not an operator"));
    case OpType::kConvolution:
      return std::unique_ptr<Operator>(new CudnnConvolution(node));
    case OpType::kPooling:
      return std::unique_ptr<Operator>(new CudaPooling(node));
    case OpType::kFullyConnected:
      return std::unique_ptr<Operator>(new CublasFullyConnected(node));
    case OpType::kBatchNorm:
      return std::unique_ptr<Operator>(new CudnnBatchNorm(node));
    case OpType::kActivation:
      return std::unique_ptr<Operator>(new CudnnActivation(node));
    case OpType::kConcat:
      return std::unique_ptr<Operator>(new CudaConcat(node));
    case OpType::kAdd:
      return std::unique_ptr<Operator>(new CudaAdd(node));
    case OpType::kDropout:
      return std::unique_ptr<Operator>(new CudaDropout(node));
    case OpType::kFlatten:
      return std::unique_ptr<Operator>(new CudaFlatten(node));
    case OpType::kSoftmaxOutput:
      return std::unique_ptr<Operator>(new CudnnSoftmaxOutput(node));
  }
  return Status::Unimplemented(
      StrCat("node '", node.name, "': no CUDA kernel for ", OpTypeName(node.op)));
}

}  // namespace pstrain::internal
