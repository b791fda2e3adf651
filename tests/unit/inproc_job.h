// A whole job inside one process on loopback (tests only): the scheduler, S
// servers and W workers as objects on their own threads, each with its own
// sockets, as separate processes would have (no globals below tools/).
#ifndef PSTRAIN_TESTS_UNIT_INPROC_JOB_H_
#define PSTRAIN_TESTS_UNIT_INPROC_JOB_H_

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "net/cluster_node.h"
#include "scheduler/scheduler.h"
#include "server/kv_server.h"
#include "tests/test_util.h"
#include "worker/kv_client.h"

namespace pstrain::testing {

using Body = std::function<Status(KVClient& kv)>;

inline ClusterOptions TestOptions(int S, int W, const std::string& host) {
  ClusterOptions o;
  o.root_host = host;
  o.bind_host = host;
  o.advertise_host = host;
  o.num_servers = S;
  o.num_workers = W;
  o.heartbeat_interval_ms = 100;
  o.heartbeat_timeout_ms = 1500;
  o.startup_timeout_ms = 5000;
  o.barrier_timeout_ms = 5000;
  o.request_timeout_ms = 5000;
  return o;
}

struct JobResult {
  Status scheduler;
  std::vector<Status> servers;
  std::vector<Status> workers;
};

struct JobSpec {
  KVClientOptions client;
  // The last server is stopped (as if it died) once this becomes true.
  std::atomic<bool>* kill_now = nullptr;
  // Workers that start (-1: all W); fewer make start-up time out (2 s then).
  int num_registering_workers = -1;
  std::string host = "127.0.0.1";
  // > 0: every server and worker has a shared-memory arena with a ring of
  // this size (servers a store of 4x it).
  int64_t shm_bytes = 0;
  // Changes worker w's options before it starts.
  std::function<void(int w, ClusterOptions*)> tweak_worker;
  KVServerOptions server;  // 2 request shards
  // The job's key file (PSTRAIN_KEY_FILE) for every node; empty: none.
  std::string key_file;
  bool encrypt = true;  // with key_file: curve (true) or auth (false)
  // Changes every node's options (scheduler's too) before anything starts.
  std::function<void(ClusterOptions*)> tweak_all;
  // Called with the scheduler's port once it is bound, before any node starts.
  std::function<void(int port)> on_scheduler;
  // Called on a server's thread with its rank and port before it registers.
  std::function<void(int rank, int port)> on_server;
  // Called on a server's thread with its rank and node before it registers,
  // and with null once its node is gone.
  std::function<void(int rank, ClusterNode* node)> on_server_node;
  // Called on a server's thread with its KVServer before it runs, and with
  // null once it returned.
  std::function<void(int rank, KVServer* server)> on_kv_server;
};

// Runs a job; `body(kv)` runs on every worker between Start and Finish.
inline JobResult RunJobWith(int S, int W, const Body& body, const JobSpec& spec) {
  JobResult r;
  ClusterOptions o = TestOptions(S, W, spec.host);
  o.shm_bytes = spec.shm_bytes;
  o.key_file = spec.key_file;
  o.encrypt = spec.encrypt;
  if (spec.num_registering_workers >= 0) o.startup_timeout_ms = 2000;
  o.root_port = 0;
  if (spec.tweak_all) spec.tweak_all(&o);
  auto sched = Scheduler::Create(o);
  CHECK_OK(sched.status());
  o.root_port = (*sched)->port();
  if (spec.on_scheduler) spec.on_scheduler(o.root_port);
  std::thread st([&] { r.scheduler = (*sched)->Run(); });
  r.servers.resize(S);
  std::vector<std::thread> threads;
  for (int s = 0; s < S; ++s) {
    threads.emplace_back([&, s] {
      ClusterOptions so = o;
      so.role = Role::kServer;
      so.shm_store_bytes = 4 * spec.shm_bytes;
      auto node = ClusterNode::Create(so);
      if (!node.ok()) {
        r.servers[s] = node.status();
        return;
      }
      if (spec.on_server) spec.on_server(s, (*node)->port());
      if (spec.on_server_node) spec.on_server_node(s, node->get());
      struct Gone {
        const JobSpec& spec;
        int s;
        ~Gone() {
          if (spec.on_server_node) spec.on_server_node(s, nullptr);
        }
      } gone{spec, s};
      KVServer server(node->get(), spec.server);
      if (spec.kill_now != nullptr && s == S - 1) {
        // This server "dies": it registers, then goes silent when told to.
        Status st = (*node)->Start();
        for (int i = 0; i < 500 && !spec.kill_now->load(); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        (*node)->Stop();
        r.servers[s] = st.ok() ? Status::Cancelled("killed by the test") : st;
        return;
      }
      if (spec.on_kv_server) spec.on_kv_server(s, &server);
      r.servers[s] = server.Run();
      if (spec.on_kv_server) spec.on_kv_server(s, nullptr);
    });
  }
  const int starting = spec.num_registering_workers < 0 ? W : spec.num_registering_workers;
  r.workers.resize(starting);
  for (int w = 0; w < starting; ++w) {
    threads.emplace_back([&, w] {
      ClusterOptions wo = o;
      wo.role = Role::kWorker;
      if (spec.tweak_worker) spec.tweak_worker(w, &wo);
      auto node = ClusterNode::Create(wo);
      if (!node.ok()) {
        r.workers[w] = node.status();
        return;
      }
      KVClient kv(node->get(), spec.client);
      Status s = kv.Start();
      if (s.ok()) s = body(kv);
      if (s.ok()) {
        s = kv.Finish(Deadline::InMillis(5000));
      } else {
        (*node)->Fail(s);
      }
      r.workers[w] = s;
    });
  }
  for (auto& t : threads) t.join();
  st.join();
  return r;
}

// The positional form the older tests use.
inline JobResult RunJob(int S, int W, const Body& body, KVClientOptions ko = {},
                        std::atomic<bool>* kill_now = nullptr, int num_registering_workers = -1,
                        const std::string& host = "127.0.0.1", int64_t shm_bytes = 0,
                        const std::function<void(int, ClusterOptions*)>& tweak_worker = nullptr,
                        KVServerOptions server_options = KVServerOptions()) {
  JobSpec spec;
  spec.client = ko;
  spec.kill_now = kill_now;
  spec.num_registering_workers = num_registering_workers;
  spec.host = host;
  spec.shm_bytes = shm_bytes;
  spec.tweak_worker = tweak_worker;
  spec.server = server_options;
  return RunJobWith(S, W, body, spec);
}

inline ServerConfig Config(bool sync, float rate) {
  ServerConfig c;
  c.set_sync_mode(sync);
  c.mutable_optimizer()->set_type(OptimizerConfig::TEST);
  c.mutable_optimizer()->set_rescale_grad(rate);
  return c;
}

inline Deadline Soon() { return Deadline::InMillis(5000); }

inline void ExpectAllOk(const JobResult& r) {
  EXPECT_OK(r.scheduler);
  for (const Status& s : r.servers) EXPECT_OK(s);
  for (const Status& s : r.workers) EXPECT_OK(s);
}

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_UNIT_INPROC_JOB_H_
