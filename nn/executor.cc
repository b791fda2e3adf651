#include "nn/executor.h"

#include <algorithm>
#include <functional>
#include <limits>

namespace pstrain {

namespace {

// A tensor the planner places: alive during steps [start, end] (inclusive).
struct Item {
  int64_t floats;
  int start, end;
  int64_t offset = -1;  // in floats, into the one arena
  bool merged = false;  // folded into another item (in-place operators): not placed
};

// Each item's offset is a multiple of kTensorAlignFloats (nn/backend.h).
int64_t Aligned(int64_t floats) {
  return (floats + kTensorAlignFloats - 1) / kTensorAlignFloats * kTensorAlignFloats;
}

// What an executor needs to know of a graph before its operators exist: the
// loss node and its label, and which nodes run backward (those on a path from
// a parameter to the loss). InvalidArgument for a graph or batch it cannot run.
struct GraphRoles {
  NodeId softmax = kInvalidNode;
  NodeId label = kInvalidNode;
  std::vector<bool> needs_grad;
};

StatusOr<GraphRoles> RolesOf(const Graph& graph, const ExecutorOptions& options) {
  if (!graph.status().ok()) return graph.status().WithContext("graph");
  if (options.batch_size < 1) {
    return Status::InvalidArgument(StrCat("batch size must be >= 1, got ", options.batch_size));
  }
  if (graph.nodes().empty()) return Status::InvalidArgument("graph has no nodes");
  const Device& device = options.backend.device;
  const int64_t limit = MaxTensorElements(device);
  // The node with the most values per example bounds the batch.
  const Node* largest = &graph.nodes()[0];
  for (const Node& n : graph.nodes()) {
    if (n.out_shape.num_elements() > largest->out_shape.num_elements()) largest = &n;
  }
  const int64_t each = largest->out_shape.num_elements();
  if (each > 0 && options.batch_size > limit / each) {
    return Status::InvalidArgument(StrCat(
        "node ", largest->name, " (", OpTypeName(largest->op), ") outputs ", each,
        " values per example: a batch of ", options.batch_size, " makes a tensor of more than the ",
        limit, " elements a tensor on ", device.ToString(), " may hold",
        device.is_cpu() ? "" : " (cuDNN indexes with int)", "; a batch of at most ", limit / each,
        " fits (per device, where several share the batch)"));
  }
  for (const ParamInfo& p : graph.params()) {
    if (p.shape.num_elements() > limit) {
      return Status::InvalidArgument(StrCat("parameter ", p.name, " ", p.shape.ToString(),
                                            " has more than the ", limit, " elements a tensor on ",
                                            device.ToString(), " may hold"));
    }
  }
  GraphRoles r;
  for (const Node& n : graph.nodes()) {
    if (n.op == OpType::kSoftmaxOutput) {
      r.softmax = n.id;
      r.label = n.inputs[1];
    }
  }
  if (options.for_training && r.softmax == kInvalidNode) {
    return Status::InvalidArgument("a training executor needs a SoftmaxOutput node");
  }
  r.needs_grad = options.for_training ? graph.NodesWithBackward()
                                      : std::vector<bool>(graph.nodes().size(), false);
  return r;
}

// Offsets into one arena, greedy by size: the largest item first takes the
// lowest offset where it overlaps (in addresses) no placed item whose
// lifetime overlaps its own. Without sharing, items lie end to end. Returns
// the arena's size in floats.
int64_t PlaceItems(std::vector<Item>* items, bool share) {
  std::vector<int> order;
  for (size_t i = 0; i < items->size(); ++i) {
    if (!(*items)[i].merged) order.push_back(static_cast<int>(i));
  }
  int64_t arena = 0;
  if (!share) {
    for (int idx : order) {
      (*items)[idx].offset = arena;
      arena += Aligned((*items)[idx].floats);
    }
    return arena;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return (*items)[a].floats > (*items)[b].floats; });
  std::vector<int> placed;  // by offset
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (int idx : order) {
    Item& it = (*items)[idx];
    busy.clear();
    for (int p : placed) {
      const Item& o = (*items)[p];
      if (o.start <= it.end && it.start <= o.end) busy.emplace_back(o.offset, o.offset + o.floats);
    }
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (const auto& [lo, hi] : busy) {
      if (lo >= at + it.floats) break;  // the gap before this one fits
      at = std::max(at, Aligned(hi));
    }
    it.offset = at;
    arena = std::max(arena, at + it.floats);
    placed.push_back(idx);
  }
  return Aligned(arena);
}

// Which nodes run in place: an element-wise operator whose input nothing
// else reads (not another consumer, not its producer's backward, not its own
// backward) writes its output, and its input gradient, over that input's
// storage.
std::vector<bool> InPlaceNodes(const Graph& graph, const ExecutorOptions& options,
                               const std::vector<std::unique_ptr<Operator>>& ops,
                               const std::vector<bool>& needs_grad, NodeId softmax) {
  const std::vector<Node>& nodes = graph.nodes();
  const int N = static_cast<int>(nodes.size());
  const bool train = options.for_training;
  std::vector<int> readers(N, 0);
  for (const Node& n : nodes) {
    for (NodeId in : n.inputs) ++readers[in];
  }
  std::vector<bool> in_place(N, false);
  for (int i = 0; i < N; ++i) {
    if (!ops[i] || !ops[i]->CanRunInPlace() || nodes[i].inputs.empty()) continue;
    const NodeId p = nodes[i].inputs[0];
    const bool keeps_input = train && needs_grad[i] && ops[i]->BackwardNeedsInputs();
    const bool producer_rereads = train && ops[p] && needs_grad[p] && ops[p]->BackwardNeedsOutput();
    in_place[i] = options.plan_memory && ops[p] != nullptr && readers[p] == 1 &&
                  p != graph.output() && p != softmax && !keeps_input && !producer_rereads &&
                  needs_grad[i] == needs_grad[p] &&
                  nodes[p].out_shape.num_elements() == nodes[i].out_shape.num_elements();
  }
  return in_place;
}

// The memory plan: what the executor allocates and binds.
struct Plan {
  std::vector<Item> items;
  std::vector<int> out_item, grad_item;                 // per node (-1: none)
  std::vector<int> scratch_fwd_item, scratch_bwd_item;  // per node (-1: none)
  // Edge gradient targets: per node, per input slot, an item index (-1: none).
  std::vector<std::vector<int>> edge_item;
  std::vector<std::vector<bool>> edge_is_temp, edge_adds;
  int64_t arena_floats = 0;
  MemoryPlanFigures figures;
};

// `scratch(i, shapes)`: node i's scratch for the shapes it will be bound to.
using ScratchFn = std::function<StatusOr<ScratchNeeds>(int, const OpShapes&)>;

StatusOr<Plan> MakePlan(const Graph& graph, const ExecutorOptions& options,
                        const std::vector<std::unique_ptr<Operator>>& ops,
                        const std::vector<bool>& needs_grad, const std::vector<bool>& in_place,
                        NodeId softmax, const ScratchFn& scratch) {
  const std::vector<Node>& nodes = graph.nodes();
  const int N = static_cast<int>(nodes.size());
  const int64_t batch = options.batch_size;
  const bool train = options.for_training;
  Plan plan;
  MemoryPlanFigures& fig = plan.figures;
  const int kForever = std::numeric_limits<int>::max();
  auto bwd = [N](int i) { return 2 * N - 1 - i; };
  std::vector<Item>& items = plan.items;
  std::vector<int>& out_item = plan.out_item;
  std::vector<int>& grad_item = plan.grad_item;
  out_item.assign(N, -1);
  grad_item.assign(N, -1);
  auto& edge_item = plan.edge_item;
  auto& edge_is_temp = plan.edge_is_temp;
  auto& edge_adds = plan.edge_adds;
  edge_item.resize(N);
  edge_is_temp.resize(N);
  edge_adds.resize(N);
  for (int i = 0; i < N; ++i) {
    const Node& n = nodes[i];
    if (n.op == OpType::kInput) continue;
    int end = i;
    if (i == graph.output() || i == softmax) end = kForever;
    if (train && needs_grad[i] && ops[i]->BackwardNeedsOutput()) end = std::max(end, bwd(i));
    if (in_place[i]) {
      out_item[i] = out_item[n.inputs[0]];
      items[out_item[i]].end = std::max(items[out_item[i]].end, end);
      continue;
    }
    out_item[i] = static_cast<int>(items.size());
    items.push_back(Item{n.out_shape.num_elements() * batch, i, end});
  }
  for (int c = 0; c < N; ++c) {
    for (NodeId in : nodes[c].inputs) {
      if (out_item[in] < 0) continue;
      Item& it = items[out_item[in]];
      if (it.end == kForever) continue;
      it.end = std::max(it.end, c);
      if (train && needs_grad[c] && ops[c]->BackwardNeedsInputs()) {
        it.end = std::max(it.end, bwd(c));
      }
    }
  }
  if (train) {
    // The primary gradient edge of a tensor is its latest consumer's first use.
    std::vector<std::pair<int, int>> primary(N, {-1, -1});
    for (int c = 0; c < N; ++c) {
      if (!needs_grad[c]) continue;
      for (size_t j = 0; j < nodes[c].inputs.size(); ++j) {
        const NodeId in = nodes[c].inputs[j];
        if (needs_grad[in] && primary[in].first != c) primary[in] = {c, static_cast<int>(j)};
      }
    }
    for (int i = 0; i < N; ++i) {
      if (!needs_grad[i] || i == softmax) continue;
      CHECK_GE(primary[i].first, 0) << "node " << nodes[i].name << " has no gradient source";
      grad_item[i] = static_cast<int>(items.size());
      items.push_back(
          Item{nodes[i].out_shape.num_elements() * batch, bwd(primary[i].first), bwd(i)});
    }
    // An in-place node's input gradient is its output gradient (last node
    // first, so chains of in-place nodes share one item).
    for (int i = N - 1; i >= 0; --i) {
      if (!in_place[i] || grad_item[i] < 0) continue;
      const NodeId p = nodes[i].inputs[0];
      Item& mine = items[grad_item[i]];
      Item& theirs = items[grad_item[p]];
      mine.start = std::min(mine.start, theirs.start);
      mine.end = std::max(mine.end, theirs.end);
      theirs.merged = true;
      grad_item[p] = grad_item[i];
    }
    // Another reader's gradient edge: added to the gradient where it lies
    // when the reader's operator can (the primary reader, whose backward runs
    // first, wrote it), else written to a temporary that is summed in.
    for (int c = 0; c < N; ++c) {
      edge_item[c].assign(nodes[c].inputs.size(), -1);
      edge_is_temp[c].assign(nodes[c].inputs.size(), false);
      edge_adds[c].assign(nodes[c].inputs.size(), false);
      if (!needs_grad[c]) continue;
      for (size_t j = 0; j < nodes[c].inputs.size(); ++j) {
        const NodeId in = nodes[c].inputs[j];
        if (!needs_grad[in]) continue;
        if (primary[in] == std::make_pair(c, static_cast<int>(j))) {
          edge_item[c][j] = grad_item[in];
        } else if (options.plan_memory && primary[in].first != c &&
                   ops[c]->CanAddToInputGradient(j)) {
          edge_item[c][j] = grad_item[in];
          edge_adds[c][j] = true;
          ++fig.gradients_added_in_place;
        } else {
          ++fig.gradients_summed_from_temporaries;
          edge_item[c][j] = static_cast<int>(items.size());
          edge_is_temp[c][j] = true;
          items.push_back(Item{nodes[in].out_shape.num_elements() * batch, bwd(c), bwd(c)});
        }
      }
    }
  }
  // Scratch: each operator's, planned for its shapes, lives during its own
  // forward or backward step only, so it takes memory dead at that step.
  std::vector<int>& scratch_fwd_item = plan.scratch_fwd_item;
  std::vector<int>& scratch_bwd_item = plan.scratch_bwd_item;
  scratch_fwd_item.assign(N, -1);
  scratch_bwd_item.assign(N, -1);
  for (int i = 0; i < N; ++i) {
    const Node& n = nodes[i];
    if (n.op == OpType::kInput) continue;
    OpShapes shapes;
    const bool backward = train && needs_grad[i];
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const NodeId in = n.inputs[j];
      shapes.in.push_back(nodes[in].out_shape.WithBatch(batch));
      shapes.in_grads.push_back(backward && needs_grad[in]);
      shapes.in_grad_add.push_back(backward && j < edge_adds[i].size() && edge_adds[i][j]);
    }
    shapes.out = n.out_shape.WithBatch(batch);
    for (int p : n.params) shapes.params.push_back(graph.params()[p].shape);
    shapes.param_grads = train && !n.params.empty();
    shapes.out_grad = backward && i != softmax;
    ASSIGN_OR_RETURN(const ScratchNeeds needs, scratch(i, shapes));
    auto add = [&](size_t bytes, int step, std::vector<int>* item) {
      if (bytes == 0) return;
      fig.largest_scratch_bytes = std::max(fig.largest_scratch_bytes, bytes);
      fig.total_scratch_bytes += bytes;
      (*item)[i] = static_cast<int>(items.size());
      items.push_back(
          Item{static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float)), step, step});
    };
    add(needs.forward_bytes, i, &scratch_fwd_item);
    add(needs.backward_bytes, bwd(i), &scratch_bwd_item);
  }
  plan.arena_floats = PlaceItems(&items, options.plan_memory);
  fig.planned_bytes = static_cast<size_t>(plan.arena_floats) * sizeof(float);
  for (const Item& it : items) {
    if (!it.merged) fig.unplanned_bytes += static_cast<size_t>(Aligned(it.floats)) * sizeof(float);
  }
  // No placement of these lifetimes needs less than the most floats alive at
  // one step: how close the plan comes is the planner's quality.
  {
    std::vector<std::pair<int, int64_t>> events;  // (step, +floats at start / -floats after end)
    for (const Item& it : items) {
      if (it.merged) continue;
      events.emplace_back(it.start, it.floats);
      if (it.end != kForever) events.emplace_back(it.end + 1, -it.floats);
    }
    std::sort(events.begin(), events.end());
    int64_t live = 0, most = 0;
    for (size_t k = 0; k < events.size(); ++k) {
      live += events[k].second;
      if (k + 1 == events.size() || events[k + 1].first != events[k].first) {
        most = std::max(most, live);
      }
    }
    fig.least_planned_bytes = static_cast<size_t>(most) * sizeof(float);
  }
  return plan;
}

}  // namespace

struct Executor::Impl {
  OpContext ctx;
  std::mt19937_64 rng;
  std::vector<std::unique_ptr<Operator>> ops;  // per node; null for inputs
  std::vector<Tensor> out;                     // per node
  std::vector<bool> runs_backward;             // per node
  // After node i's backward: add each (temp, target) pair: target += temp.
  std::vector<std::vector<std::pair<Tensor, Tensor>>> accumulate;
  std::vector<double> fwd_s, bwd_s;  // per node, when profiling
  NodeId softmax = kInvalidNode;
  NodeId label = kInvalidNode;
  bool forward_train_done = false;
};

Executor::Executor(const Graph& graph, const ExecutorOptions& options)
    : graph_(graph), options_(options), impl_(std::make_unique<Impl>()) {}

Executor::~Executor() = default;

StatusOr<std::unique_ptr<Executor>> Executor::Create(const Graph& graph,
                                                     const ExecutorOptions& options) {
  std::unique_ptr<Executor> exec(new Executor(graph, options));
  RETURN_IF_ERROR(exec->Init());
  return exec;
}

StatusOr<MemoryPlanFigures> Executor::PlanWithoutDevice(const Graph& graph,
                                                        const ExecutorOptions& options) {
  ASSIGN_OR_RETURN(const GraphRoles roles, RolesOf(graph, options));
  ASSIGN_OR_RETURN(const std::vector<std::unique_ptr<Operator>> ops,
                   Backend::CreateOperatorsWithoutDevice(options.backend, graph));
  const std::vector<bool> in_place =
      InPlaceNodes(graph, options, ops, roles.needs_grad, roles.softmax);
  ASSIGN_OR_RETURN(const Plan plan,
                   MakePlan(graph, options, ops, roles.needs_grad, in_place, roles.softmax,
                            [](int, const OpShapes&) { return ScratchNeeds{}; }));
  return plan.figures;
}

Status Executor::Init() {
  Impl& m = *impl_;
  const std::vector<Node>& nodes = graph_.nodes();
  const int N = static_cast<int>(nodes.size());
  const int64_t batch = options_.batch_size;
  const bool train = options_.for_training;
  // (The graph is checked before the device is set up.)
  ASSIGN_OR_RETURN(const GraphRoles roles, RolesOf(graph_, options_));
  ASSIGN_OR_RETURN(backend_, Backend::Create(options_.backend));
  node_mu_.reset(new Mutex[N]);

  Backend& be = *backend_;
  m.ctx.backend = &be;
  m.rng.seed(options_.seed);
  m.ctx.rng = &m.rng;
  m.softmax = roles.softmax;
  m.label = roles.label;
  const std::vector<bool>& needs_grad = roles.needs_grad;
  m.runs_backward = needs_grad;

  // Operators (created before planning: they say what their backward reads).
  m.ops.resize(N);
  for (int i = 0; i < N; ++i) {
    if (nodes[i].op == OpType::kInput) continue;
    ASSIGN_OR_RETURN(m.ops[i], be.CreateOperator(nodes[i]));
    m.ops[i]->LearnInputShapes(graph_);
  }

  const std::vector<bool> in_place = InPlaceNodes(graph_, options_, m.ops, needs_grad, m.softmax);
  be.PlanGraph(graph_, batch, in_place);

  // ---- memory plan ----
  ASSIGN_OR_RETURN(const Plan plan, MakePlan(graph_, options_, m.ops, needs_grad, in_place,
                                             m.softmax, [&](int i, const OpShapes& shapes) {
                                               be.EnterNode(i);
                                               return m.ops[i]->PlanScratch(m.ctx, shapes);
                                             }));
  figures_ = plan.figures;
  const std::vector<Item>& items = plan.items;
  const std::vector<int>& out_item = plan.out_item;
  const std::vector<int>& grad_item = plan.grad_item;
  const std::vector<int>& scratch_fwd_item = plan.scratch_fwd_item;
  const std::vector<int>& scratch_bwd_item = plan.scratch_bwd_item;
  const auto& edge_item = plan.edge_item;
  const auto& edge_is_temp = plan.edge_is_temp;
  const auto& edge_adds = plan.edge_adds;
  // The allocations that a batch too large for the device meets: an error
  // that says what did not fit, not a crash.
  auto no_room = [&](const Status& s, const std::string& what) {
    return Status::ResourceExhausted(
        StrCat(what, " for a batch of ", batch, ": ", s.message(), "; a smaller batch may fit"));
  };
  StatusOr<std::shared_ptr<Buffer>> made_arena =
      be.TryAllocate(static_cast<size_t>(plan.arena_floats));
  if (!made_arena.ok()) {
    return no_room(made_arena.status(),
                   StrCat("the activations and their gradients (the memory plan: ",
                          plan.arena_floats * sizeof(float) / (1 << 20), " MiB)"));
  }
  const std::shared_ptr<Buffer> arena = std::move(made_arena).value();
  auto view = [&](int item, const Shape& per_sample) {
    return Tensor(arena, static_cast<size_t>(items[item].offset), per_sample.WithBatch(batch));
  };

  // ---- tensors ----
  m.out.resize(N);
  for (int i = 0; i < N; ++i) {
    const Node& n = nodes[i];
    if (n.op == OpType::kInput) {
      StatusOr<Tensor> in = be.TryZeros(n.out_shape.WithBatch(batch));
      if (!in.ok()) return no_room(in.status(), StrCat("the input '", n.name, "'"));
      m.out[i] = std::move(in).value();
    } else {
      m.out[i] = view(out_item[i], n.out_shape);
    }
  }
  std::vector<Shape> param_shapes, aux_shapes;
  for (const ParamInfo& p : graph_.params()) param_shapes.push_back(p.shape);
  for (const ParamInfo& a : graph_.aux_states()) aux_shapes.push_back(a.shape);
  // (Their size does not depend on the batch, but they come after the arena.)
  auto zeros_packed = [&](const std::vector<Shape>& shapes, const char* what,
                          std::vector<Tensor>* out) {
    StatusOr<std::vector<Tensor>> t = be.TryZerosPacked(shapes);
    if (!t.ok()) return no_room(t.status(), what);
    *out = std::move(t).value();
    return Status::Ok();
  };
  RETURN_IF_ERROR(zeros_packed(param_shapes, "the parameters", &params_));
  if (train) {
    RETURN_IF_ERROR(zeros_packed(param_shapes, "the parameters' gradients", &grads_));
  } else {
    grads_.assign(param_shapes.size(), Tensor());
  }
  RETURN_IF_ERROR(zeros_packed(aux_shapes, "the aux states", &aux_));
  m.accumulate.resize(N);
  m.fwd_s.assign(N, 0.0);
  m.bwd_s.assign(N, 0.0);
  for (int i = 0; i < N; ++i) {
    const Node& n = nodes[i];
    if (n.op == OpType::kInput) continue;
    OpTensors t;
    for (NodeId in : n.inputs) t.in.push_back(m.out[in]);
    t.out = m.out[i];
    for (int p : n.params) {
      t.params.push_back(params_[p]);
      if (train) t.param_grads.push_back(grads_[p]);
    }
    for (int a : n.aux) t.aux.push_back(aux_[a]);
    t.in_grads.resize(n.inputs.size());
    if (train && needs_grad[i]) {
      t.in_grad_add = edge_adds[i];
      for (size_t j = 0; j < n.inputs.size(); ++j) {
        if (edge_item[i][j] < 0) continue;
        const Shape& s = nodes[n.inputs[j]].out_shape;
        t.in_grads[j] = view(edge_item[i][j], s);
        if (edge_is_temp[i][j]) {
          m.accumulate[i].emplace_back(t.in_grads[j], view(grad_item[n.inputs[j]], s));
        }
      }
      if (i != m.softmax) t.out_grad = view(grad_item[i], n.out_shape);
    }
    auto scratch = [&](int item) {
      return Tensor(arena, static_cast<size_t>(items[item].offset), Shape{items[item].floats});
    };
    if (scratch_fwd_item[i] >= 0) t.scratch_forward = scratch(scratch_fwd_item[i]);
    if (scratch_bwd_item[i] >= 0) t.scratch_backward = scratch(scratch_bwd_item[i]);
    // (oneDNN plans a primitive's work split for the team size at creation.)
    be.EnterNode(i);
    RETURN_IF_ERROR(m.ops[i]->Setup(m.ctx, t));
  }
  return Status::Ok();
}

void Executor::SetGradReadyCallback(std::function<void(int)> fn) { on_grad_ready_ = std::move(fn); }
void Executor::SetParamNeededCallback(std::function<void(int)> fn) {
  on_param_needed_ = std::move(fn);
}
void Executor::Reseed(uint64_t seed) { impl_->rng.seed(seed); }

void Executor::Forward(bool is_train) {
  for (NodeId i = 0; i < num_nodes(); ++i) ForwardNode(i, is_train);
}

void Executor::Backward() {
  for (NodeId i = num_nodes() - 1; i >= 0; --i) BackwardNode(i);
}

void Executor::ForwardNode(NodeId i, bool is_train) {
  Impl& m = *impl_;
  m.ctx.is_train = is_train;
  if (i == 0) m.forward_train_done = false;
  if (m.ops[i]) {
    if (on_param_needed_) {
      for (int p : graph_.node(i).params) on_param_needed_(p);
    }
    MutexLock lock(&node_mu_[i]);
    backend_->EnterNode(i);
    if (options_.profile) {
      backend_->StartTiming();
      m.ops[i]->Forward(m.ctx);
      m.fwd_s[i] += backend_->StopTiming();
    } else {
      m.ops[i]->Forward(m.ctx);
    }
  }
  if (i == num_nodes() - 1) m.forward_train_done = is_train;
}

void Executor::BackwardNode(NodeId i) {
  Impl& m = *impl_;
  CHECK(options_.for_training) << "Backward on an inference executor";
  CHECK(m.forward_train_done) << "Backward needs a Forward(is_train=true) first";
  if (m.runs_backward[i]) {
    {
      MutexLock lock(&node_mu_[i]);
      backend_->EnterNode(i);
      if (options_.profile) backend_->StartTiming();
      m.ops[i]->Backward(m.ctx);
      for (auto& [temp, target] : m.accumulate[i]) backend_->Add(temp, target);
      if (options_.profile) m.bwd_s[i] += backend_->StopTiming();
    }
    if (on_grad_ready_) {
      for (int p : graph_.node(i).params) on_grad_ready_(p);
    }
  }
  if (i == 0) m.forward_train_done = false;
}

std::vector<NodeProfile> Executor::Profile() const {
  std::vector<NodeProfile> rows;
  if (!options_.profile) return rows;
  for (const Node& n : graph_.nodes()) {
    if (n.op == OpType::kInput) continue;
    rows.push_back({n.name, OpTypeName(n.op), impl_->fwd_s[n.id], impl_->bwd_s[n.id]});
  }
  return rows;
}

Tensor Executor::input(const std::string& name) const {
  NodeId id = graph_.Find(name);
  if (id == kInvalidNode || graph_.node(id).op != OpType::kInput) return Tensor();
  return impl_->out[id];
}

Tensor Executor::data() const {
  return graph_.input_nodes().empty() ? Tensor() : impl_->out[graph_.input_nodes()[0]];
}

Tensor Executor::label() const {
  return impl_->label == kInvalidNode ? Tensor() : impl_->out[impl_->label];
}

Tensor Executor::output() const { return impl_->out[graph_.output()]; }

float Executor::Loss() const {
  return impl_->softmax == kInvalidNode ? 0.0f : impl_->ops[impl_->softmax]->Loss();
}

Status CheckArrayCopy(const char* what, int i, const std::vector<ParamInfo>& infos, size_t n) {
  const int count = static_cast<int>(infos.size());
  if (i < 0 || i >= count) {
    return Status::InvalidArgument(StrCat(what, " index ", i, " out of range [0, ", count, ")"));
  }
  if (static_cast<int64_t>(n) != infos[i].shape.num_elements()) {
    return Status::InvalidArgument(StrCat(what, " '", infos[i].name, "' has ",
                                          infos[i].shape.num_elements(), " elements, got ", n));
  }
  return Status::Ok();
}

Status Executor::LoadData(const float* src, size_t n) {
  const Tensor d = data();
  if (!d.defined() || static_cast<int64_t>(n) != d.num_elements()) {
    return Status::InvalidArgument(
        StrCat("a batch of ", n, " values does not fit the input ", d.shape().ToString()));
  }
  backend_->CopyFromHost(src, d);
  return Status::Ok();
}

Status Executor::LoadLabel(const float* src, size_t n) {
  const Tensor l = label();
  if (!l.defined()) return Status::InvalidArgument("the graph has no label input");
  if (static_cast<int64_t>(n) < l.num_elements()) {
    return Status::InvalidArgument(
        StrCat(n, " labels for a batch of ", l.num_elements(), " examples"));
  }
  backend_->CopyFromHost(src, l);
  return Status::Ok();
}

Status Executor::ReadOutput(float* dst, size_t n) const {
  const Tensor o = output();
  if (static_cast<int64_t>(n) != o.num_elements()) {
    return Status::InvalidArgument(
        StrCat("output ", o.shape().ToString(), " has ", o.num_elements(), " values, got ", n));
  }
  backend_->CopyToHost(o, dst);
  return Status::Ok();
}

Status Executor::ReadParam(int i, float* dst, size_t n) const {
  RETURN_IF_ERROR(CheckArrayCopy("parameter", i, graph_.params(), n));
  MutexLock lock(&node_mu_[OwnerNodeOfParam(i)]);
  backend_->CopyToHost(params_[i], dst);
  return Status::Ok();
}

Status Executor::WriteParam(int i, const float* src, size_t n) {
  RETURN_IF_ERROR(CheckArrayCopy("parameter", i, graph_.params(), n));
  MutexLock lock(&node_mu_[OwnerNodeOfParam(i)]);
  backend_->CopyFromHost(src, params_[i]);
  return Status::Ok();
}

Status Executor::ReadGrad(int i, float* dst, size_t n) const {
  RETURN_IF_ERROR(CheckArrayCopy("gradient of parameter", i, graph_.params(), n));
  if (!grads_[i].defined()) {
    return Status::FailedPrecondition("an inference executor has no gradients");
  }
  backend_->CopyToHost(grads_[i], dst);
  return Status::Ok();
}

Status Executor::ReadAux(int i, float* dst, size_t n) const {
  RETURN_IF_ERROR(CheckArrayCopy("aux state", i, graph_.aux_states(), n));
  MutexLock lock(&node_mu_[graph_.aux_states()[i].node]);
  backend_->CopyToHost(aux_[i], dst);
  return Status::Ok();
}

Status Executor::WriteAux(int i, const float* src, size_t n) {
  RETURN_IF_ERROR(CheckArrayCopy("aux state", i, graph_.aux_states(), n));
  MutexLock lock(&node_mu_[graph_.aux_states()[i].node]);
  backend_->CopyFromHost(src, aux_[i]);
  return Status::Ok();
}

float* Executor::host_param(int i) const {
  return backend_->host_accessible() ? params_[i].data() : nullptr;
}

float* Executor::host_grad(int i) const {
  return backend_->host_accessible() && grads_[i].defined() ? grads_[i].data() : nullptr;
}

}  // namespace pstrain
