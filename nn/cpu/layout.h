// Activation layouts of the CPU backend (internal to nn/).
//
// oneDNN's convolutions, batch norm and pooling run fastest on channel-blocked
// tensors (nChw16c on AVX-512: 16 channels of one pixel side by side), several
// times faster than on plain NCHW. The layout plan keeps an image tensor
// blocked from the convolution that makes it to the layers that read it, so
// only the edges of the network reorder: the data batch in, and tensors read
// by layers that want NCHW (fully connected, flatten, the reference loops).
//
// A tensor is blocked only when its channels are a multiple of the block, so
// it holds exactly as many floats as its NCHW twin: buffers, the memory plan
// and the layout-blind operators (element-wise sum, activations, and concat
// along channels, which copies whole blocks per sample) work unchanged.
// Dropout stays plain: its mask is drawn in memory order, and the same seed
// must drop the same activations whatever the kernels.
// A blocked (C, 1, 1) tensor is byte for byte its NCHW twin, so a global
// pooling's output feeds a fully connected layer as it is.
#ifndef PSTRAIN_NN_CPU_LAYOUT_H_
#define PSTRAIN_NN_CPU_LAYOUT_H_

#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "nn/graph.h"

namespace pstrain::internal {

// The channel block oneDNN's convolutions prefer on this CPU (16 with
// AVX-512, 8 with AVX2), found by asking oneDNN once; 0 when they prefer a
// plain layout, forward or backward (SSE4.1 alone: its forward is blocked,
// its backward plain).
int PreferredChannelBlock();

// Per node: the channel block of its output (and of its gradient), or 0 for
// plain NCHW. Inputs, the graph's output, and tensors read by a layer that
// wants plain NCHW stay plain; each layout-preserving layer (batch norm,
// pooling, activation, sum, concat) has one layout for all its
// tensors; a convolution may change it. `block` 0 plans every tensor plain.
std::vector<int> PlanActivationLayouts(const Graph& graph, int block);

// Whether oneDNN's pooling computes this node (false: the reference loops,
// which need plain tensors). MXNet divides an average by the window clipped to
// the symmetrically padded input, while oneDNN counts the extra right padding
// that kFull rounding adds, so those average poolings run the reference loops.
bool DnnlPoolingApplies(const Node& node, const Shape& in_per_sample);
// The right padding oneDNN's pooling needs for MXNet's output size.
int64_t PoolRightPad(int64_t in, int64_t out, int kernel, int stride, int pad);

// The oneDNN descriptor of a dense row-major float tensor of `dims` (1-5 dims).
dnnl::memory::desc PlainDesc(const dnnl::memory::dims& dims);
// The oneDNN descriptor of a float tensor of `dims` (N, C, ...) in the
// layout `block` (0: plain).
dnnl::memory::desc ActivationDesc(const dnnl::memory::dims& dims, int block);

}  // namespace pstrain::internal

#endif  // PSTRAIN_NN_CPU_LAYOUT_H_
