// CPU operators through oneDNN: convolution, pooling, batch norm and
// activations as oneDNN primitives (created once in Setup, bound to the
// executor's fixed buffers), fully connected as oneDNN's sgemm.
//
// Layouts: each activation is in the layout the backend planned for it
// (nn/cpu/layout.h: channel-blocked between convolutions, batch norms and
// poolings; plain NCHW at the network's edges). Convolution asks oneDNN for
// its preferred layouts with format `any` and reorders at its boundary, into
// buffers it owns, whatever differs from the planned one (the data batch,
// and always the weights, which the KV store holds in OIHW). The forward's
// reordered source and weights are reused by the backward when the layouts
// agree. The other layers compute in the layout they are given.
#include <omp.h>

#include <algorithm>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <unordered_map>
#include <vector>

#include "nn/cpu/cpu_backend.h"
#include "nn/cpu/cpu_engine.h"
#include "nn/cpu/cpu_ops.h"
#include "nn/cpu/layout.h"

namespace pstrain::internal {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

memory::dims Dims(const Shape& s) { return memory::dims(s.dims().begin(), s.dims().end()); }

memory UserMemory(CpuEngine* cpu, const memory::dims& dims, float* data) {
  return memory(PlainDesc(dims), cpu->engine(), data);
}

// An activation (or its gradient) of node `id` in its planned layout.
memory ActivationMemory(const OpContext& ctx, NodeId id, const memory::dims& dims, float* data) {
  CpuBackend& be = CpuBackend::Of(ctx);
  return memory(ActivationDesc(dims, be.layout(id)), be.engine().engine(), data);
}

// A tensor as one primitive wants it: the user's plain memory, or a buffer in
// the primitive's layout plus the reorders to and from the user's.
struct Staged {
  memory user;
  memory prim;
  std::optional<dnnl::reorder> to_prim, to_user;
  int64_t* count = nullptr;  // CpuEngine's counter of this kind of reorder

  // `param`: a parameter or its gradient (else an activation or its gradient).
  void Init(CpuEngine* cpu, const memory& user_mem, const memory::desc& want, bool param) {
    if (want != user_mem.get_desc()) return Link(cpu, user_mem, memory(want, cpu->engine()), param);
    user = prim = user_mem;
    count = Counter(cpu, param);
  }
  // Stages between two existing memories.
  void Link(CpuEngine* cpu, const memory& user_mem, const memory& prim_mem, bool param) {
    user = user_mem;
    prim = prim_mem;
    count = Counter(cpu, param);
    to_prim = dnnl::reorder(user, prim);
    to_user = dnnl::reorder(prim, user);
  }
  // Like Init, but shares `other`'s primitive buffer when the layouts agree
  // (the data there is still current: the forward staged it).
  void InitShared(CpuEngine* cpu, const Staged& other, const memory::desc& want) {
    if (want == other.prim.get_desc()) {
      user = other.user;
      prim = other.prim;
      return;
    }
    Init(cpu, other.user, want, other.count == Counter(cpu, true));
  }
  void In(dnnl::stream& s) {
    if (to_prim) Run(*to_prim, s, user, prim, count);
  }
  void Out(dnnl::stream& s) {
    if (to_user) Run(*to_user, s, prim, user, count);
  }

 private:
  static int64_t* Counter(CpuEngine* cpu, bool param) {
    return param ? &cpu->param_reorders : &cpu->activation_reorders;
  }
  // Small reorders (weights, mostly) run on the calling thread: waking the
  // team would cost more than copying.
  static void Run(dnnl::reorder& r, dnnl::stream& s, memory& from, memory& to, int64_t* count) {
    ++*count;
    const int team = omp_get_max_threads();
    const bool small = from.get_desc().get_size() < (4u << 20);
    if (small && team > 1) omp_set_num_threads(1);
    r.execute(s, from, to);
    if (small && team > 1) omp_set_num_threads(team);
  }
};

Status DnnlError(const Node& node, const dnnl::error& e) {
  return Status::Internal(
      StrCat("oneDNN setup of ", OpTypeName(node.op), " '", node.name, "' failed: ", e.what()));
}

class DnnlConvolution : public Operator {
 public:
  explicit DnnlConvolution(const Node& node) : Operator(node) {}

 protected:
  // The primitive descriptors, from the shapes and the planned layouts; their
  // scratchpads (user mode) are this operator's scratch, which the executor
  // places in its arena for the forward and the backward step.
  StatusOr<ScratchNeeds> DoPlanScratch(const OpContext& ctx) override {
    ScratchNeeds needs;
    try {
      Describe(ctx);
      needs.forward_bytes = fwd_pd_.scratchpad_desc().get_size();
      if (has_bww_) needs.backward_bytes = bww_pd_.scratchpad_desc().get_size();
      if (has_bwd_data_) {
        needs.backward_bytes = std::max(needs.backward_bytes, bwd_pd_.scratchpad_desc().get_size());
      }
    } catch (const dnnl::error& e) {
      return DnnlError(node_, e);
    }
    return needs;
  }

  Status DoSetup(const OpContext& ctx) override {
    try {
      Build(ctx);
    } catch (const dnnl::error& e) {
      return DnnlError(node_, e);
    }
    return Status::Ok();
  }

  void Describe(const OpContext& ctx) {
    CpuEngine* cpu = &CpuBackend::Of(ctx).engine();
    const ConvParam& p = node_.conv;
    const memory::dims src_dims = Dims(shapes_.in[0]), dst_dims = Dims(shapes_.out);
    const memory::dims w_dims = WeightDims();
    const memory::dims b_dims = {p.num_filter};
    const memory::dims strides = {p.stride_h, p.stride_w}, pad = {p.pad_h, p.pad_w};
    auto any = [](const memory::dims& d) { return memory::desc(d, Dt::f32, Tag::any); };
    const memory::desc bias_any = p.no_bias ? memory::desc() : any(b_dims);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);

    dnnl::convolution_forward::desc fd(dnnl::prop_kind::forward_training,
                                       dnnl::algorithm::convolution_direct, any(src_dims),
                                       any(w_dims), bias_any, any(dst_dims), strides, pad, pad);
    fwd_pd_ = dnnl::convolution_forward::primitive_desc(fd, attr, cpu->engine());
    has_bww_ = shapes_.param_grads && shapes_.out_grad;
    if (!has_bww_) return;
    dnnl::convolution_backward_weights::desc wd(dnnl::algorithm::convolution_direct, any(src_dims),
                                                any(w_dims), bias_any, any(dst_dims), strides, pad,
                                                pad);
    bww_pd_ = dnnl::convolution_backward_weights::primitive_desc(wd, attr, cpu->engine(), fwd_pd_);
    has_bwd_data_ = shapes_.in_grads[0];
    if (!has_bwd_data_) return;
    dnnl::convolution_backward_data::desc dd(dnnl::algorithm::convolution_direct, any(src_dims),
                                             any(w_dims), any(dst_dims), strides, pad, pad);
    bwd_pd_ = dnnl::convolution_backward_data::primitive_desc(dd, attr, cpu->engine(), fwd_pd_);
  }

  memory::dims WeightDims() const {
    const ConvParam& p = node_.conv;
    memory::dims w_dims = Dims(shapes_.params[0]);
    if (p.num_group > 1) {
      w_dims = {p.num_group, p.num_filter / p.num_group, w_dims[1], w_dims[2], w_dims[3]};
    }
    return w_dims;
  }

  // A scratchpad memory over the bound scratch (none when it needs none).
  static memory ScratchMemory(CpuEngine* cpu, const memory::desc& want, const Tensor& scratch) {
    if (want.get_size() == 0) return memory();
    return memory(want, cpu->engine(), scratch.data());
  }

  void Build(const OpContext& ctx) {
    CpuEngine* cpu = &CpuBackend::Of(ctx).engine();
    const ConvParam& p = node_.conv;
    const memory::dims src_dims = Dims(t_.in[0].shape()), dst_dims = Dims(t_.out.shape());
    const memory::dims w_dims = WeightDims();
    const memory::dims b_dims = {p.num_filter};
    fwd_ = dnnl::convolution_forward(fwd_pd_);
    fwd_scratch_ = ScratchMemory(cpu, fwd_pd_.scratchpad_desc(), t_.scratch_forward);
    const NodeId in = node_.inputs[0];
    src_.Init(cpu, ActivationMemory(ctx, in, src_dims, t_.in[0].data()), fwd_pd_.src_desc(), false);
    w_.Init(cpu, memory(PlainDesc(w_dims), cpu->engine(), t_.params[0].data()),
            fwd_pd_.weights_desc(), true);
    dst_.Init(cpu, ActivationMemory(ctx, node_.id, dst_dims, t_.out.data()), fwd_pd_.dst_desc(),
              false);
    if (!p.no_bias) bias_ = UserMemory(cpu, b_dims, t_.params[1].data());

    if (!has_bww_) return;
    bww_ = dnnl::convolution_backward_weights(bww_pd_);
    bww_scratch_ = ScratchMemory(cpu, bww_pd_.scratchpad_desc(), t_.scratch_backward);
    bww_src_.InitShared(cpu, src_, bww_pd_.src_desc());
    const memory diff_dst_user = ActivationMemory(ctx, node_.id, dst_dims, t_.out_grad.data());
    bww_diff_dst_.Init(cpu, diff_dst_user, bww_pd_.diff_dst_desc(), false);
    diff_w_.Init(cpu, memory(PlainDesc(w_dims), cpu->engine(), t_.param_grads[0].data()),
                 bww_pd_.diff_weights_desc(), true);
    if (!p.no_bias) diff_bias_ = UserMemory(cpu, b_dims, t_.param_grads[1].data());

    if (!has_bwd_data_) return;
    bwd_ = dnnl::convolution_backward_data(bwd_pd_);
    bwd_scratch_ = ScratchMemory(cpu, bwd_pd_.scratchpad_desc(), t_.scratch_backward);
    bwd_w_.InitShared(cpu, w_, bwd_pd_.weights_desc());
    bwd_diff_dst_.InitShared(cpu, bww_diff_dst_, bwd_pd_.diff_dst_desc());
    diff_src_.Init(cpu, ActivationMemory(ctx, in, src_dims, t_.in_grads[0].data()),
                   bwd_pd_.diff_src_desc(), false);
  }

  void DoForward(const OpContext& ctx) override {
    dnnl::stream& s = CpuBackend::Of(ctx).engine().stream();
    src_.In(s);
    w_.In(s);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, src_.prim}, {DNNL_ARG_WEIGHTS, w_.prim}, {DNNL_ARG_DST, dst_.prim}};
    if (!node_.conv.no_bias) args[DNNL_ARG_BIAS] = bias_;
    if (fwd_scratch_) args[DNNL_ARG_SCRATCHPAD] = fwd_scratch_;
    fwd_.execute(s, args);
    dst_.Out(s);
    s.wait();
  }

  void DoBackward(const OpContext& ctx) override {
    if (!has_bww_) return;
    dnnl::stream& s = CpuBackend::Of(ctx).engine().stream();
    bww_src_.In(s);  // no-op when shared with the forward's staging
    bww_diff_dst_.In(s);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, bww_src_.prim},
                                         {DNNL_ARG_DIFF_DST, bww_diff_dst_.prim},
                                         {DNNL_ARG_DIFF_WEIGHTS, diff_w_.prim}};
    if (!node_.conv.no_bias) args[DNNL_ARG_DIFF_BIAS] = diff_bias_;
    if (bww_scratch_) args[DNNL_ARG_SCRATCHPAD] = bww_scratch_;
    bww_.execute(s, args);
    diff_w_.Out(s);
    if (has_bwd_data_) {
      bwd_w_.In(s);
      bwd_diff_dst_.In(s);
      std::unordered_map<int, memory> data_args{{DNNL_ARG_DIFF_DST, bwd_diff_dst_.prim},
                                                {DNNL_ARG_WEIGHTS, bwd_w_.prim},
                                                {DNNL_ARG_DIFF_SRC, diff_src_.prim}};
      if (bwd_scratch_) data_args[DNNL_ARG_SCRATCHPAD] = bwd_scratch_;
      bwd_.execute(s, data_args);
      diff_src_.Out(s);
    }
    s.wait();
  }

 private:
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_weights::primitive_desc bww_pd_;
  dnnl::convolution_backward_weights bww_;
  dnnl::convolution_backward_data::primitive_desc bwd_pd_;
  dnnl::convolution_backward_data bwd_;
  Staged src_, w_, dst_, bww_src_, bww_diff_dst_, diff_w_, bwd_w_, bwd_diff_dst_, diff_src_;
  memory bias_, diff_bias_;
  memory fwd_scratch_, bww_scratch_, bwd_scratch_;  // over t_.scratch_* (empty: none)
  bool has_bww_ = false, has_bwd_data_ = false;
};

class DnnlPooling : public Operator {
 public:
  explicit DnnlPooling(const Node& node) : Operator(node) {}
  // Max pooling keeps oneDNN's workspace (argmax), so the backward reads no
  // forward tensor; the only fallback (average pooling) reads none either.
  bool BackwardNeedsInputs() const override { return false; }
  bool BackwardNeedsOutput() const override { return false; }

 protected:
  Status DoSetup(const OpContext& ctx) override {
    const PoolParam& p = node_.pool;
    const Shape& xs = t_.in[0].shape();
    const Shape& ys = t_.out.shape();
    if (!DnnlPoolingApplies(node_, xs.WithoutBatch())) return UseFallback(ctx);
    const int64_t pr_h = PoolRightPad(xs[2], ys[2], p.kernel_h, p.stride_h, p.pad_h);
    const int64_t pr_w = PoolRightPad(xs[3], ys[3], p.kernel_w, p.stride_w, p.pad_w);
    // One layout for input and output (the input's: a pooled (C, 1, 1) is
    // the same bytes in either).
    const int block = CpuBackend::Of(ctx).layout(node_.inputs[0]);
    try {
      CpuEngine* cpu = &CpuBackend::Of(ctx).engine();
      const memory::desc src_md = ActivationDesc(Dims(xs), block);
      const memory::desc dst_md = ActivationDesc(Dims(ys), block);
      const dnnl::algorithm alg = p.type == PoolType::kMax
                                      ? dnnl::algorithm::pooling_max
                                      : dnnl::algorithm::pooling_avg_include_padding;
      dnnl::pooling_forward::desc fd(dnnl::prop_kind::forward_training, alg, src_md, dst_md,
                                     {p.stride_h, p.stride_w}, {p.kernel_h, p.kernel_w},
                                     {p.pad_h, p.pad_w}, {pr_h, pr_w});
      fwd_pd_ = dnnl::pooling_forward::primitive_desc(fd, cpu->engine());
      fwd_ = dnnl::pooling_forward(fwd_pd_);
      src_ = memory(src_md, cpu->engine(), t_.in[0].data());
      dst_ = memory(dst_md, cpu->engine(), t_.out.data());
      if (p.type == PoolType::kMax) workspace_ = memory(fwd_pd_.workspace_desc(), cpu->engine());
      if (t_.in_grads[0].defined() && t_.out_grad.defined()) {
        dnnl::pooling_backward::desc bd(alg, src_md, dst_md, {p.stride_h, p.stride_w},
                                        {p.kernel_h, p.kernel_w}, {p.pad_h, p.pad_w}, {pr_h, pr_w});
        bwd_pd_ = dnnl::pooling_backward::primitive_desc(bd, cpu->engine(), fwd_pd_);
        bwd_ = dnnl::pooling_backward(bwd_pd_);
        diff_src_ = memory(src_md, cpu->engine(), t_.in_grads[0].data());
        diff_dst_ = memory(dst_md, cpu->engine(), t_.out_grad.data());
      }
    } catch (const dnnl::error& e) {
      // Average pooling's reference loops read no forward tensor in the
      // backward either, so they fit this operator's memory plan (max
      // pooling's need input and output); they need plain tensors.
      if (p.type == PoolType::kAvg && block == 0) return UseFallback(ctx);
      return DnnlError(node_, e);
    }
    return Status::Ok();
  }

  void DoForward(const OpContext& ctx) override {
    if (fallback_) return fallback_->Forward(ctx);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src_}, {DNNL_ARG_DST, dst_}};
    if (node_.pool.type == PoolType::kMax) args[DNNL_ARG_WORKSPACE] = workspace_;
    fwd_.execute(CpuBackend::Of(ctx).engine().stream(), args);
    CpuBackend::Of(ctx).engine().stream().wait();
  }

  void DoBackward(const OpContext& ctx) override {
    if (fallback_) return fallback_->Backward(ctx);
    if (!t_.in_grads[0].defined()) return;
    std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, diff_dst_},
                                         {DNNL_ARG_DIFF_SRC, diff_src_}};
    if (node_.pool.type == PoolType::kMax) args[DNNL_ARG_WORKSPACE] = workspace_;
    bwd_.execute(CpuBackend::Of(ctx).engine().stream(), args);
    CpuBackend::Of(ctx).engine().stream().wait();
  }

 private:
  Status UseFallback(const OpContext& ctx) {
    fallback_ = MakeReferenceOperator(node_);
    return fallback_->Setup(ctx, t_);
  }

  std::unique_ptr<Operator> fallback_;
  dnnl::pooling_forward::primitive_desc fwd_pd_;
  dnnl::pooling_forward fwd_;
  dnnl::pooling_backward::primitive_desc bwd_pd_;
  dnnl::pooling_backward bwd_;
  memory src_, dst_, workspace_, diff_src_, diff_dst_;
};

class DnnlFullyConnected : public Operator {
 public:
  explicit DnnlFullyConnected(const Node& node) : Operator(node) {}

 protected:
  void DoForward(const OpContext& ctx) override {
    const int64_t N = t_.in[0].shape()[0], K = t_.in[0].shape().ProductFrom(1);
    const int64_t M = node_.fc.num_hidden;
    float* y = t_.out.data();
    float beta = 0.0f;
    if (!node_.fc.no_bias) {
      const float* b = t_.params[1].data();
      for (int64_t n = 0; n < N; ++n) std::copy(b, b + M, y + n * M);
      beta = 1.0f;
    }
    CHECK_EQ(
        dnnl_sgemm('N', 'T', N, M, K, 1.0f, t_.in[0].data(), K, t_.params[0].data(), K, beta, y, M),
        dnnl_success);
  }

  void DoBackward(const OpContext& ctx) override {
    const int64_t N = t_.in[0].shape()[0], K = t_.in[0].shape().ProductFrom(1);
    const int64_t M = node_.fc.num_hidden;
    const float* dy = t_.out_grad.data();
    CHECK_EQ(dnnl_sgemm('T', 'N', M, K, N, 1.0f, dy, M, t_.in[0].data(), K, 0.0f,
                        t_.param_grads[0].data(), K),
             dnnl_success);
    if (!node_.fc.no_bias) {
      float* db = t_.param_grads[1].data();
      std::fill(db, db + M, 0.0f);
      for (int64_t n = 0; n < N; ++n) {
        const float* row = dy + n * M;
        for (int64_t m = 0; m < M; ++m) db[m] += row[m];
      }
    }
    if (t_.in_grads[0].defined()) {
      CHECK_EQ(dnnl_sgemm('N', 'N', N, K, M, 1.0f, dy, M, t_.params[0].data(), K, 0.0f,
                          t_.in_grads[0].data(), K),
               dnnl_success);
    }
  }
};

class DnnlBatchNorm : public Operator {
 public:
  explicit DnnlBatchNorm(const Node& node) : Operator(node) {}

 protected:
  Status DoSetup(const OpContext& ctx) override {
    try {
      CpuEngine* cpu = &CpuBackend::Of(ctx).engine();
      const Shape& xs = t_.in[0].shape();
      const int64_t C = xs[1];
      // Images in their planned layout; other shapes (N, C, rest...) as plain
      // (N, C, S, 1).
      memory::desc md = PlainDesc({xs[0], C});
      const int block = CpuBackend::Of(ctx).layout(node_.inputs[0]);
      if (xs.ndim() == 4) {
        md = ActivationDesc(Dims(xs), block);
      } else if (xs.ndim() > 2) {
        md = PlainDesc({xs[0], C, xs.ProductFrom(2), 1});
      }
      auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
      // The ReLU after this batch norm runs in place on its output: apply it
      // here (its backward masks diff_dst with the workspace's sign bits).
      fuse_relu_ = CpuBackend::Of(ctx).fuses_relu(node_.id);
      if (fuse_relu_) flags |= dnnl::normalization_flags::fuse_norm_relu;
      const float eps = node_.bn.eps;
      train_pd_ = dnnl::batch_normalization_forward::primitive_desc(
          {dnnl::prop_kind::forward_training, md, eps, flags}, cpu->engine());
      train_ = dnnl::batch_normalization_forward(train_pd_);
      infer_pd_ = dnnl::batch_normalization_forward::primitive_desc(
          {dnnl::prop_kind::forward_inference, md, eps,
           flags | dnnl::normalization_flags::use_global_stats},
          cpu->engine());
      infer_ = dnnl::batch_normalization_forward(infer_pd_);
      if (fuse_relu_) workspace_ = memory(train_pd_.workspace_desc(), cpu->engine());
      src_ = memory(md, cpu->engine(), t_.in[0].data());
      dst_ = memory(md, cpu->engine(), t_.out.data());
      const memory::desc cd = PlainDesc({C});
      ones_.assign(C, 1.0f);
      scale_ = memory(cd, cpu->engine(), node_.bn.fix_gamma ? ones_.data() : t_.params[0].data());
      shift_ = memory(cd, cpu->engine(), t_.params[1].data());
      mean_ = memory(cd, cpu->engine());
      var_ = memory(cd, cpu->engine());
      moving_mean_ = memory(cd, cpu->engine(), t_.aux[0].data());
      moving_var_ = memory(cd, cpu->engine(), t_.aux[1].data());
      if (t_.out_grad.defined() && !t_.param_grads.empty()) {
        bwd_pd_ = dnnl::batch_normalization_backward::primitive_desc(
            {dnnl::prop_kind::backward, md, md, eps, flags}, cpu->engine(), train_pd_);
        bwd_ = dnnl::batch_normalization_backward(bwd_pd_);
        diff_dst_ = memory(md, cpu->engine(), t_.out_grad.data());
        if (t_.in_grads[0].defined()) {
          diff_src_ = memory(md, cpu->engine(), t_.in_grads[0].data());
        } else {
          diff_src_ = memory(md, cpu->engine());  // computed by the primitive, unused
        }
        diff_scale_ = node_.bn.fix_gamma ? memory(cd, cpu->engine())
                                         : memory(cd, cpu->engine(), t_.param_grads[0].data());
        diff_shift_ = memory(cd, cpu->engine(), t_.param_grads[1].data());
      }
    } catch (const dnnl::error& e) {
      return DnnlError(node_, e);
    }
    return Status::Ok();
  }

  void DoForward(const OpContext& ctx) override {
    dnnl::stream& s = CpuBackend::Of(ctx).engine().stream();
    if (ctx.is_train) {
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src_},     {DNNL_ARG_DST, dst_},
                                           {DNNL_ARG_SCALE, scale_}, {DNNL_ARG_SHIFT, shift_},
                                           {DNNL_ARG_MEAN, mean_},   {DNNL_ARG_VARIANCE, var_}};
      if (fuse_relu_) args[DNNL_ARG_WORKSPACE] = workspace_;
      train_.execute(s, args);
      s.wait();
      const float m = node_.bn.momentum;
      float* mm = t_.aux[0].data();
      float* mv = t_.aux[1].data();
      const float* bm = static_cast<float*>(mean_.get_data_handle());
      const float* bv = static_cast<float*>(var_.get_data_handle());
      for (size_t c = 0; c < ones_.size(); ++c) {
        mm[c] = m * mm[c] + (1 - m) * bm[c];
        mv[c] = m * mv[c] + (1 - m) * bv[c];
      }
    } else {
      infer_.execute(s, {{DNNL_ARG_SRC, src_},
                         {DNNL_ARG_DST, dst_},
                         {DNNL_ARG_SCALE, scale_},
                         {DNNL_ARG_SHIFT, shift_},
                         {DNNL_ARG_MEAN, moving_mean_},
                         {DNNL_ARG_VARIANCE, moving_var_}});
      s.wait();
    }
  }

  void DoBackward(const OpContext& ctx) override {
    dnnl::stream& s = CpuBackend::Of(ctx).engine().stream();
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src_},
                                         {DNNL_ARG_MEAN, mean_},
                                         {DNNL_ARG_VARIANCE, var_},
                                         {DNNL_ARG_DIFF_DST, diff_dst_},
                                         {DNNL_ARG_SCALE, scale_},
                                         {DNNL_ARG_SHIFT, shift_},
                                         {DNNL_ARG_DIFF_SRC, diff_src_},
                                         {DNNL_ARG_DIFF_SCALE, diff_scale_},
                                         {DNNL_ARG_DIFF_SHIFT, diff_shift_}};
    if (fuse_relu_) args[DNNL_ARG_WORKSPACE] = workspace_;
    bwd_.execute(s, args);
    s.wait();
    if (node_.bn.fix_gamma) t_.param_grads[0].Fill(0.0f);
  }

 private:
  dnnl::batch_normalization_forward::primitive_desc train_pd_, infer_pd_;
  dnnl::batch_normalization_forward train_, infer_;
  dnnl::batch_normalization_backward::primitive_desc bwd_pd_;
  dnnl::batch_normalization_backward bwd_;
  std::vector<float> ones_;
  bool fuse_relu_ = false;
  memory workspace_;  // the fused ReLU's mask, from the training forward to the backward
  memory src_, dst_, scale_, shift_, mean_, var_, moving_mean_, moving_var_;
  memory diff_dst_, diff_src_, diff_scale_, diff_shift_;
};

class DnnlActivation : public Operator {
 public:
  explicit DnnlActivation(const Node& node) : Operator(node) {}
  bool BackwardNeedsInputs() const override { return false; }
  bool BackwardNeedsOutput() const override { return true; }
  bool CanRunInPlace() const override { return true; }

 protected:
  Status DoSetup(const OpContext& ctx) override {
    // A ReLU fused into the batch norm before it (in place): nothing to do.
    fused_away_ = CpuBackend::Of(ctx).fused_away(node_.id);
    if (fused_away_) return Status::Ok();
    try {
      CpuEngine* cpu = &CpuBackend::Of(ctx).engine();
      const Shape& s = t_.out.shape();
      const memory::desc md = PlainDesc({s[0], s.ProductFrom(1)});
      dnnl::algorithm alg = dnnl::algorithm::eltwise_relu_use_dst_for_bwd;
      if (node_.act == ActType::kTanh) alg = dnnl::algorithm::eltwise_tanh_use_dst_for_bwd;
      if (node_.act == ActType::kSigmoid) alg = dnnl::algorithm::eltwise_logistic_use_dst_for_bwd;
      fwd_pd_ = dnnl::eltwise_forward::primitive_desc(
          {dnnl::prop_kind::forward_training, alg, md, 0.0f, 0.0f}, cpu->engine());
      fwd_ = dnnl::eltwise_forward(fwd_pd_);
      src_ = memory(md, cpu->engine(), t_.in[0].data());
      dst_ = memory(md, cpu->engine(), t_.out.data());
      if (t_.in_grads[0].defined() && t_.out_grad.defined()) {
        bwd_pd_ = dnnl::eltwise_backward::primitive_desc({alg, md, md, 0.0f, 0.0f}, cpu->engine(),
                                                         fwd_pd_);
        bwd_ = dnnl::eltwise_backward(bwd_pd_);
        diff_dst_ = memory(md, cpu->engine(), t_.out_grad.data());
        diff_src_ = memory(md, cpu->engine(), t_.in_grads[0].data());
      }
    } catch (const dnnl::error& e) {
      return DnnlError(node_, e);
    }
    return Status::Ok();
  }

  void DoForward(const OpContext& ctx) override {
    if (fused_away_) return;
    fwd_.execute(CpuBackend::Of(ctx).engine().stream(),
                 {{DNNL_ARG_SRC, src_}, {DNNL_ARG_DST, dst_}});
    CpuBackend::Of(ctx).engine().stream().wait();
  }

  void DoBackward(const OpContext& ctx) override {
    if (fused_away_ || !t_.in_grads[0].defined()) return;
    bwd_.execute(
        CpuBackend::Of(ctx).engine().stream(),
        {{DNNL_ARG_DST, dst_}, {DNNL_ARG_DIFF_DST, diff_dst_}, {DNNL_ARG_DIFF_SRC, diff_src_}});
    CpuBackend::Of(ctx).engine().stream().wait();
  }

 private:
  dnnl::eltwise_forward::primitive_desc fwd_pd_;
  dnnl::eltwise_forward fwd_;
  dnnl::eltwise_backward::primitive_desc bwd_pd_;
  dnnl::eltwise_backward bwd_;
  bool fused_away_ = false;
  memory src_, dst_, diff_dst_, diff_src_;
};

// Flatten of a channel-blocked image: a reorder to NCHW, which is the
// flattened (N, C*H*W) (a plain input is copied by the reference loops).
class DnnlFlatten : public Operator {
 public:
  explicit DnnlFlatten(const Node& node) : Operator(node) {}
  bool BackwardNeedsInputs() const override { return false; }

 protected:
  Status DoSetup(const OpContext& ctx) override {
    CpuBackend& be = CpuBackend::Of(ctx);
    const Shape& xs = t_.in[0].shape();
    // A plain input, or a blocked one of one pixel (the same bytes): a copy.
    if (be.layout(node_.inputs[0]) == 0 || xs.ndim() != 4 || xs[2] * xs[3] == 1) {
      fallback_ = MakeReferenceOperator(node_);
      return fallback_->Setup(ctx, t_);
    }
    try {
      CpuEngine* cpu = &be.engine();
      const memory::dims dims = Dims(xs);
      // user: the plain output and its gradient; prim: the blocked input
      // and its gradient.
      x_.Link(cpu, UserMemory(cpu, dims, t_.out.data()),
              ActivationMemory(ctx, node_.inputs[0], dims, t_.in[0].data()), false);
      if (t_.in_grads[0].defined() && t_.out_grad.defined()) {
        dx_.Link(cpu, UserMemory(cpu, dims, t_.out_grad.data()),
                 ActivationMemory(ctx, node_.inputs[0], dims, t_.in_grads[0].data()), false);
      }
    } catch (const dnnl::error& e) {
      return DnnlError(node_, e);
    }
    return Status::Ok();
  }

  void DoForward(const OpContext& ctx) override {
    if (fallback_) return fallback_->Forward(ctx);
    x_.Out(CpuBackend::Of(ctx).engine().stream());  // blocked input -> plain output
    CpuBackend::Of(ctx).engine().stream().wait();
  }

  void DoBackward(const OpContext& ctx) override {
    if (fallback_) return fallback_->Backward(ctx);
    if (!t_.in_grads[0].defined()) return;
    dx_.In(CpuBackend::Of(ctx).engine().stream());  // plain gradient -> blocked
    CpuBackend::Of(ctx).engine().stream().wait();
  }

 private:
  std::unique_ptr<Operator> fallback_;
  Staged x_, dx_;
};

}  // namespace

std::unique_ptr<Operator> MakeDnnlOperator(const Node& node) {
  switch (node.op) {
    case OpType::kConvolution:
      return std::make_unique<DnnlConvolution>(node);
    case OpType::kPooling:
      return std::make_unique<DnnlPooling>(node);
    case OpType::kFullyConnected:
      return std::make_unique<DnnlFullyConnected>(node);
    case OpType::kBatchNorm:
      return std::make_unique<DnnlBatchNorm>(node);
    case OpType::kActivation:
      return std::make_unique<DnnlActivation>(node);
    case OpType::kFlatten:
      return std::make_unique<DnnlFlatten>(node);
    default:
      return nullptr;
  }
}

}  // namespace pstrain::internal
