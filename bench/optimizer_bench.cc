// The optimizers' update speed on one thread (nn/optimizer.h), as a server
// shard thread runs it: each rule over --elems floats, for one gradient (an
// async push, the local updater) and for --workers gradients summed on the
// fly (a dist_sync round). Best of --reps repetitions of --iters updates.
//
//   optimizer_bench [--elems 4194304] [--workers 4] [--iters 10] [--reps 5]
//
// GB/s counts the bytes an update must move: each gradient read, the weights
// read and written, each state array read and written.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "nn/optimizer.h"

namespace pstrain {
namespace {

struct Rule {
  const char* name;
  OptimizerConfig cfg;
};

std::vector<Rule> Rules() {
  std::vector<Rule> out;
  OptimizerConfig c;
  c.set_learning_rate(0.01f);
  c.set_wd(1e-4f);
  c.set_rescale_grad(0.25f);
  out.push_back({"sgd", c});
  c.set_momentum(0.9f);
  out.push_back({"sgd mom 0.9", c});
  c.set_type(OptimizerConfig::NAG);
  out.push_back({"nag mom 0.9", c});
  c.clear_momentum();
  c.set_type(OptimizerConfig::ADAM);
  out.push_back({"adam", c});
  c.set_type(OptimizerConfig::RMSPROP);
  out.push_back({"rmsprop", c});
  c.set_centered(true);
  out.push_back({"rmsprop centered", c});
  c.clear_centered();
  c.set_type(OptimizerConfig::ADAGRAD);
  out.push_back({"adagrad", c});
  return out;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Best seconds per update of `opt` over grads (k of them, summed when k > 1).
double Time(Optimizer& opt, const std::vector<const float*>& grads, std::vector<float>* w,
            ParamState* state, int iters, int reps) {
  const size_t n = w->size();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      if (grads.size() == 1) {
        opt.Update(grads[0], w->data(), n, state);
      } else {
        opt.Update(grads.data(), grads.size(), w->data(), n, state);
      }
    }
    best = std::min(best, Seconds(t0, std::chrono::steady_clock::now()) / iters);
  }
  return best;
}

int Main(int argc, char** argv) {
  size_t n = size_t{1} << 22;
  int workers = 4, iters = 10, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--elems") {
      n = std::strtoull(v, nullptr, 10);
    } else if (a == "--workers") {
      workers = std::atoi(v);
    } else if (a == "--iters") {
      iters = std::atoi(v);
    } else if (a == "--reps") {
      reps = std::atoi(v);
    } else {
      std::fprintf(stderr, "optimizer_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (n == 0 || workers < 1 || iters < 1 || reps < 1) {
    std::fprintf(stderr, "optimizer_bench: --elems, --workers, --iters and --reps must be >= 1\n");
    return 2;
  }
  std::vector<std::vector<float>> g(workers, std::vector<float>(n));
  for (int k = 0; k < workers; ++k) {
    for (size_t i = 0; i < n; ++i) g[k][i] = 1e-3f * static_cast<float>((i * 7 + k) % 201) - 0.1f;
  }
  std::vector<const float*> one = {g[0].data()}, all;
  for (const auto& gk : g) all.push_back(gk.data());
  std::printf("%zu floats (%.1f MB) per update, one thread; %d gradients summed for dist_sync\n\n",
              n, n * 4 / 1e6, workers);
  std::printf("%-18s %6s %12s %10s %14s %10s\n", "rule", "slots", "1 grad ms", "GB/s",
              "sum of W ms", "GB/s");
  for (const Rule& rule : Rules()) {
    auto opt = Optimizer::Create(rule.cfg);
    if (!opt.ok()) {
      std::fprintf(stderr, "optimizer_bench: %s\n", opt.status().ToString().c_str());
      return 1;
    }
    const int slots = (*opt)->num_slots();
    std::vector<float> w(n, 0.5f);
    ParamState state;
    const double t1 = Time(**opt, one, &w, &state, iters, reps);
    const double tw = Time(**opt, all, &w, &state, iters, reps);
    const double moved1 = 4.0 * n * (1 + 2 + 2 * slots);
    const double movedw = 4.0 * n * (workers + 2 + 2 * slots);
    std::printf("%-18s %6d %12.2f %10.2f %14.2f %10.2f\n", rule.name, slots, t1 * 1e3,
                moved1 / t1 / 1e9, tw * 1e3, movedw / tw / 1e9);
  }
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) { return pstrain::Main(argc, argv); }
