// cluster_bench: what cluster mode costs. Runs the same operations through the
// real core and the native HTTP host against one ClickHouse server and against
// a replica of a two-replica cluster (quorum 2) on the same machine, in one
// run, and prints a Markdown table with the ratios.
//
//   python3 tools/cluster_bench.py            # starts both, runs this, stops both
//   cluster_bench --single-port P --cluster-port Q --cluster NAME [--iterations N]
//   (user "chstate"; the password of each is read from CHSTATE_BENCH_SINGLE_PASSWORD
//   and CHSTATE_BENCH_CLUSTER_PASSWORD, never from the command line)
//
// Operations, each --iterations times on a fresh state id per iteration where
// it matters, p50 / p99 / mean in ms:
//   get        Store::Get of an existing id (select_sequential_consistency on the cluster)
//   set        Store::Set, Meltano's plain write (a quorum INSERT on the cluster)
//   update     Store::Update: lock, get, set, unlock (Meltano's per-STATE-message cost)
//   lock       AcquireLock + ReleaseLock, uncontended (ON CLUSTER CREATE / DROP on the cluster)
//   delete     Store::Delete (a quorum tombstone on the cluster, a mutation on one server)
// Exit code 1 when any operation failed (printed on stderr).
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/config.h"
#include "core/state.h"
#include "core/store.h"
#include "hosts/native/executor.h"

namespace chstate {
namespace {

int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct Stats {
  double p50 = 0, p99 = 0, mean = 0;
};

Stats Summarise(std::vector<double> ms) {
  Stats s;
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  s.p50 = ms[ms.size() / 2];
  s.p99 = ms[std::min(ms.size() - 1, static_cast<size_t>(ms.size() * 0.99))];
  for (double v : ms) s.mean += v;
  s.mean /= ms.size();
  return s;
}

struct Target {
  std::string label;
  std::unique_ptr<native::HttpExecutor> exec;
  std::unique_ptr<Store> store;
};

absl::StatusOr<Target> Connect(const std::string& label, int port, const char* password_env,
                               const std::string& cluster) {
  ConnectionConfig c;
  c.host = "127.0.0.1";
  c.port = port;
  c.user = "chstate";
  const char* pw = std::getenv(password_env);
  c.password = pw ? pw : "";
  c.database = "default";
  Target t;
  t.label = label;
  t.exec = std::make_unique<native::HttpExecutor>(c);
  StoreOptions o;
  o.schema = "chstate_cluster_bench";
  o.endpoint = t.exec->endpoint();
  o.lock.timeout_ms = 60000;
  o.lock.retry_ms = 10;
  o.cluster.name = cluster;
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Create(o);
  if (!store.ok()) return store.status();
  t.store = *std::move(store);
  if (absl::StatusOr<Result> init = native::RunTask(*t.store->Init(), *t.exec); !init.ok()) return init.status();
  return t;
}

MeltanoState Sample(const std::string& id, int i) {
  MeltanoState s;
  s.state_id = id;
  s.completed = nlohmann::json::parse(
      absl::StrCat(R"({"singer_state":{"bookmarks":{"orders":{"replication_key_value":"2024-01-01T00:00:)", i % 60,
                   R"(Z"}}}})"));
  return s;
}

// One operation, run `n` times; `op(i)` returns its status.
absl::StatusOr<Stats> Measure(int n, const std::function<absl::Status(int)>& op) {
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    int64_t t0 = MonoNs();
    absl::Status s = op(i);
    if (!s.ok()) return s;
    ms.push_back((MonoNs() - t0) / 1e6);
  }
  return Summarise(ms);
}

int Run(int single_port, int cluster_port, const std::string& cluster, int iterations) {
  std::vector<Target> targets;
  for (auto [label, port, env, name] :
       {std::make_tuple("one server", single_port, "CHSTATE_BENCH_SINGLE_PASSWORD", std::string()),
        std::make_tuple("cluster (2 replicas, quorum 2)", cluster_port, "CHSTATE_BENCH_CLUSTER_PASSWORD", cluster)}) {
    absl::StatusOr<Target> t = Connect(label, port, env, name);
    if (!t.ok()) {
      std::cerr << "cluster_bench: " << label << ": " << t.status() << "\n";
      return 1;
    }
    targets.push_back(*std::move(t));
  }
  const char* kOps[] = {"get", "set", "update", "lock", "delete"};
  std::map<std::string, std::vector<Stats>> results;
  bool failed = false;
  for (Target& t : targets) {
    Store& st = *t.store;
    native::HttpExecutor& ex = *t.exec;
    auto run = [&ex](std::unique_ptr<Task> task) { return native::RunTask(*task, ex).status(); };
    if (absl::Status s = run(st.Set(Sample("bench:get", 0))); !s.ok()) {
      std::cerr << "cluster_bench: " << t.label << ": seeding: " << s << "\n";
      return 1;
    }
    std::map<std::string, std::function<absl::Status(int)>> ops = {
        {"get", [&](int) { return run(st.Get("bench:get")); }},
        {"set", [&](int i) { return run(st.Set(Sample("bench:set", i))); }},
        {"update", [&](int i) { return run(st.Update(Sample("bench:update", i))); }},
        {"lock",
         [&](int) -> absl::Status {
           absl::StatusOr<Result> got = native::RunTask(*st.AcquireLock("bench:lock"), ex);
           if (!got.ok()) return got.status();
           return run(st.ReleaseLock("bench:lock", got->lock_id));
         }},
    };
    for (const char* op : kOps) {
      absl::StatusOr<Stats> s = Stats{};
      if (std::string(op) == "delete") {
        // Time the delete alone: set first, untimed.
        std::vector<double> ms;
        for (int i = 0; i < iterations && s.ok(); ++i) {
          std::string id = absl::StrCat("bench:delete:", i);
          if (absl::Status w = run(st.Set(Sample(id, i))); !w.ok()) {
            s = w;
            break;
          }
          int64_t t0 = MonoNs();
          if (absl::Status d = run(st.Delete(id)); !d.ok()) {
            s = d;
            break;
          }
          ms.push_back((MonoNs() - t0) / 1e6);
        }
        if (s.ok()) s = Summarise(ms);
      } else {
        s = Measure(iterations, ops[op]);
      }
      if (!s.ok()) {
        std::cerr << "cluster_bench: " << t.label << ": " << op << ": " << s.status() << "\n";
        failed = true;
        results[op].push_back(Stats{});
        continue;
      }
      results[op].push_back(*s);
    }
  }
  std::cout << "## chstate cluster mode: cost on one machine (" << iterations
            << " iterations per operation, ClickHouse 18.16, loopback)\n\n"
            << "| operation | one server p50 / p99 ms | cluster p50 / p99 ms | cluster / one server (p50) |\n"
            << "|---|---|---|---|\n";
  for (const char* op : kOps) {
    const Stats& a = results[op][0];
    const Stats& b = results[op][1];
    std::cout << absl::StrFormat("| %s | %.2f / %.2f | %.2f / %.2f | %.1fx |\n", op, a.p50, a.p99, b.p50, b.p99,
                                 a.p50 > 0 ? b.p50 / a.p50 : 0.0);
  }
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace chstate

int main(int argc, char** argv) {
  int single_port = 0, cluster_port = 0, iterations = 30;
  std::string cluster;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    bool ok = true;
    if (flag == "--single-port") {
      ok = absl::SimpleAtoi(value, &single_port);
    } else if (flag == "--cluster-port") {
      ok = absl::SimpleAtoi(value, &cluster_port);
    } else if (flag == "--cluster") {
      cluster = value;
    } else if (flag == "--iterations") {
      ok = absl::SimpleAtoi(value, &iterations) && iterations > 0;
    } else {
      ok = false;
    }
    if (!ok) {
      std::cerr << "cluster_bench: bad flag " << flag << " " << value << "\n";
      return 2;
    }
  }
  if (single_port <= 0 || cluster_port <= 0 || cluster.empty()) {
    std::cerr << "usage: cluster_bench --single-port P --cluster-port Q --cluster NAME [--iterations N]\n"
                 "(passwords in CHSTATE_BENCH_SINGLE_PASSWORD and CHSTATE_BENCH_CLUSTER_PASSWORD)\n";
    return 2;
  }
  return chstate::Run(single_port, cluster_port, cluster, iterations);
}
