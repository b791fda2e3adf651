#include "nn/cpu/layout.h"

#include <algorithm>

namespace pstrain::internal {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

// A (C, H, W) tensor whose channels fill whole blocks.
bool BlockableImage(const Shape& s, int block) { return s.ndim() == 3 && s[0] % block == 0; }

// A blocked (C, 1, 1) tensor is byte for byte its plain twin.
bool SamePlainAndBlocked(const Shape& s) { return s.ndim() == 3 && s[1] * s[2] == 1; }

// Layers whose oneDNN operator takes its input in any layout (the
// convolution and flatten reorder what they need themselves).
bool ReadsAnyLayout(const Graph& g, const Node& n) {
  switch (n.op) {
    case OpType::kConvolution:
    case OpType::kBatchNorm:
    case OpType::kActivation:
    case OpType::kAdd:
    case OpType::kConcat:
    case OpType::kFlatten:
      return true;
    case OpType::kPooling:
      return DnnlPoolingApplies(n, g.node(n.inputs[0]).out_shape);
    default:
      return false;
  }
}

// Layers that compute in the layout of their input and write it unchanged.
bool KeepsLayout(const Node& n) {
  switch (n.op) {
    case OpType::kBatchNorm:
    case OpType::kPooling:
    case OpType::kActivation:
    case OpType::kAdd:
    case OpType::kConcat:
      return true;
    default:
      return false;
  }
}

}  // namespace

int PreferredChannelBlock() {
  static const int block = [] {
    try {
      dnnl::engine eng(dnnl::engine::kind::cpu, 0);
      auto any = [](const memory::dims& d) {
        return memory::desc(d, memory::data_type::f32, Tag::any);
      };
      const memory::dims x = {32, 64, 14, 14}, w = {64, 64, 3, 3};
      dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training,
                                        dnnl::algorithm::convolution_direct, any(x), any(w),
                                        memory::desc(), any(x), {1, 1}, {1, 1}, {1, 1});
      dnnl::convolution_forward::primitive_desc pd(d, eng);
      // The activations' channel block a primitive chose, 0 for none.
      auto channel_block = [](const memory::desc& m) {
        const dnnl_memory_desc_t& md = m.data;
        const auto& blk = md.format_desc.blocking;
        if (md.format_kind != dnnl_blocked || blk.inner_nblks != 1 || blk.inner_idxs[0] != 1) {
          return 0;
        }
        const int b = static_cast<int>(blk.inner_blks[0]);
        return b == 8 || b == 16 ? b : 0;
      };
      const int b = channel_block(pd.src_desc());
      // Training runs the backward passes too: where they want another
      // layout (with SSE4.1 alone, oneDNN's backward convolutions are gemm
      // on plain NCHW), blocked activations would be reordered for every one
      // of them, so every tensor stays plain.
      dnnl::convolution_backward_data::desc bd(dnnl::algorithm::convolution_direct, any(x), any(w),
                                               any(x), {1, 1}, {1, 1}, {1, 1});
      dnnl::convolution_backward_data::primitive_desc bpd(bd, eng, pd);
      dnnl::convolution_backward_weights::desc wd(dnnl::algorithm::convolution_direct, any(x),
                                                  any(w), memory::desc(), any(x), {1, 1}, {1, 1},
                                                  {1, 1});
      dnnl::convolution_backward_weights::primitive_desc wpd(wd, eng, pd);
      if (channel_block(bpd.diff_src_desc()) != b || channel_block(wpd.src_desc()) != b) return 0;
      return b;
    } catch (const dnnl::error&) {
      return 0;
    }
  }();
  return block;
}

std::vector<int> PlanActivationLayouts(const Graph& graph, int block) {
  const std::vector<Node>& nodes = graph.nodes();
  std::vector<int> layout(nodes.size(), 0);
  if (block <= 0) return layout;
  std::vector<bool> blocked(nodes.size(), false);
  for (const Node& n : nodes) {
    blocked[n.id] = n.op != OpType::kInput && n.id != graph.output() &&
                    (n.op == OpType::kConvolution || KeepsLayout(n)) &&
                    (n.op != OpType::kPooling || ReadsAnyLayout(graph, n)) &&
                    BlockableImage(n.out_shape, block);
  }
  // Take blocks away until every layer agrees; each pass only turns tensors
  // plain, so this ends within nodes.size() passes.
  for (bool changed = true; changed;) {
    changed = false;
    auto make_plain = [&](NodeId id) {
      if (blocked[id]) {
        blocked[id] = false;
        changed = true;
      }
    };
    // Plain and not also a blocked tensor (as a blockable one-pixel one is).
    auto plain_only = [&](NodeId id) {
      const Shape& s = nodes[id].out_shape;
      return !blocked[id] && !(SamePlainAndBlocked(s) && BlockableImage(s, block));
    };
    for (const Node& n : nodes) {
      if (n.op == OpType::kInput) continue;
      if (!ReadsAnyLayout(graph, n)) {
        for (NodeId in : n.inputs) {
          if (!SamePlainAndBlocked(nodes[in].out_shape)) make_plain(in);
        }
      }
      if (!KeepsLayout(n)) continue;
      // Mixed layouts: all plain.
      bool mixed = plain_only(n.id);
      for (NodeId in : n.inputs) mixed = mixed || plain_only(in);
      if (!mixed) continue;
      make_plain(n.id);
      for (NodeId in : n.inputs) make_plain(in);
    }
  }
  for (const Node& n : nodes) layout[n.id] = blocked[n.id] ? block : 0;
  return layout;
}

int64_t PoolRightPad(int64_t in, int64_t out, int kernel, int stride, int pad) {
  return std::max<int64_t>(pad, (out - 1) * stride + kernel - in - pad);
}

bool DnnlPoolingApplies(const Node& node, const Shape& in) {
  const PoolParam& p = node.pool;  // the graph resolved global pooling's kernel
  if (p.type != PoolType::kAvg) return true;
  const Shape& out = node.out_shape;
  return PoolRightPad(in[1], out[1], p.kernel_h, p.stride_h, p.pad_h) <= p.pad_h &&
         PoolRightPad(in[2], out[2], p.kernel_w, p.stride_w, p.pad_w) <= p.pad_w;
}

memory::desc PlainDesc(const memory::dims& dims) {
  static const Tag kPlain[] = {Tag::undef, Tag::a, Tag::ab, Tag::abc, Tag::abcd, Tag::abcde};
  return memory::desc(dims, memory::data_type::f32, kPlain[dims.size()]);
}

memory::desc ActivationDesc(const memory::dims& dims, int block) {
  if (block == 0 || dims.size() != 4) return PlainDesc(dims);
  return memory::desc(dims, memory::data_type::f32, block == 16 ? Tag::nChw16c : Tag::nChw8c);
}

}  // namespace pstrain::internal
