// cluster_bench: what cluster mode costs. Runs the same operations through the
// real core and the native HTTP host against one ClickHouse server and against
// a three-replica cluster (quorum 2) named by its host list, on the same
// machine, in one run, and prints a Markdown table with the ratios.
//
//   python3 tools/cluster_bench.py            # starts both, runs this twice, stops both
//   cluster_bench --single-port P --cluster-hosts H1:P1,H2:P2,H3:P3 --cluster NAME
//                 [--iterations N] [--title TEXT] [--skip-init]
//   (user "chstate"; the password of each is read from CHSTATE_BENCH_SINGLE_PASSWORD
//   and CHSTATE_BENCH_CLUSTER_PASSWORD, never from the command line)
//
// The host list is read as the core reads the `host` setting (a comma-separated
// h1:p1,h2:p2 list, core/config.h) and handed to the store, which picks the
// host for every request: the first while it answers. tools/cluster_bench.py
// runs this once with every replica up and once, with --skip-init (Init's
// ON CLUSTER DDL would wait for the stopped host), with a replica that is not
// the first stopped.
//
// Operations, each --iterations times (after one untimed warm-up) on a fresh
// state id per iteration where it matters, p50 / p99 in ms:
//   get           Store::Get of an existing id (select_sequential_consistency on the cluster)
//   set           Store::Set (a quorum INSERT on the cluster, under the id's lock
//                 taken for it)
//   update        Store::Update: lock, get, set, unlock
//   update_linger update() as the Meltano adapter runs it (Meltano's per-STATE-message
//                 cost): acquire_lock, set, release_lock with linger_locks, so the
//                 lock of the last update is taken back with no request
//   update_raw    update()'s floor: the state read and the (quorum) INSERT as the
//                 store writes them, sent raw to the first host over one connection;
//                 measured in turns with update_linger (one of each, and again), so
//                 that both see the same load
//   lock          AcquireLock + ReleaseLock, uncontended (quorum claim rows on the cluster)
//   delete        Store::Delete (a quorum tombstone on the cluster, a mutation on one server)
// Beside each, the requests it sent on the cluster per operation and how many
// of them were quorum writes. Exit code 1 when any operation failed (printed
// on stderr).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/config.h"
#include "core/defaults.h"
#include "core/response.h"
#include "core/statements.h"
#include "core/state.h"
#include "core/store.h"
#include "core/task.h"
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
  double requests = 0, quorum_writes = 0;  // per iteration
  std::string purposes;                     // "insert_state 1.00, ..." per iteration
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

// What the timed runs of an operation sent: requests in all, and those that
// were quorum writes (an insert_quorum parameter).
struct Sent {
  int64_t requests = 0, quorum_writes = 0;
  std::map<std::string, int64_t> purposes;
};
Sent* g_sent = nullptr;  // counted while set (the timed iterations)

// `sent` over `n` iterations, per iteration, into `st`.
void AddSent(const Sent& sent, int n, Stats* st) {
  st->requests = static_cast<double>(sent.requests) / n;
  st->quorum_writes = static_cast<double>(sent.quorum_writes) / n;
  for (const auto& [purpose, count] : sent.purposes) {
    absl::StrAppend(&st->purposes, st->purposes.empty() ? "" : ", ", purpose,
                    absl::StrFormat(" %.2f", static_cast<double>(count) / n));
  }
}

// native::RunTask with each request counted into g_sent.
absl::StatusOr<Result> Drive(Task& task, native::HttpExecutor& exec) {
  auto now = [] { return Inputs{native::MonotonicMs(), native::OsRandomBytes()}; };
  Action a = task.Start(now());
  while (true) {
    switch (a.kind) {
      case Action::Kind::kRunSql:
        if (g_sent != nullptr) {
          ++g_sent->requests;
          ++g_sent->purposes[a.request.purpose];
          for (const auto& [key, value] : a.request.url_params) g_sent->quorum_writes += key == "insert_quorum";
        }
        a = task.OnResponse(exec.Execute(a.request), now());
        break;
      case Action::Kind::kWait:
        std::this_thread::sleep_for(std::chrono::milliseconds(a.wait_ms));
        a = task.OnTimer(now());
        break;
      case Action::Kind::kDone:
        return std::move(a.result);
      case Action::Kind::kFailed:
        return a.status;
    }
  }
}

struct Target {
  std::string label;
  std::unique_ptr<native::HttpExecutor> exec;
  std::unique_ptr<Store> store;
  // The same with linger_locks, as the Meltano adapter runs it: the lock of a
  // run's updates is taken back with no request.
  std::unique_ptr<Store> lingering;
  // The floor of update(): its statements as the store writes them, sent
  // raw, all to the first host (one keep-alive connection).
  std::optional<Statements> statements;
  Endpoint first_host;
};

// `where`: the connection settings that say where (`host` and `port`, or a
// `host` list of several host:port), resolved by the core as the CLI's are.
absl::StatusOr<Target> Connect(const std::string& label, std::map<std::string, std::string> where,
                               const char* password_env, const std::string& cluster, bool init) {
  ConfigSources sources;
  sources.flags = std::move(where);
  sources.flags["user"] = "chstate";
  sources.flags["database"] = "default";
  if (const char* pw = std::getenv(password_env); pw != nullptr && *pw != '\0') sources.flags["password"] = pw;
  if (!cluster.empty()) sources.flags["cluster"] = cluster;
  absl::StatusOr<ConnectionConfig> c = ResolveConfig(sources);
  if (!c.ok()) return c.status();
  Target t;
  t.label = label;
  t.exec = std::make_unique<native::HttpExecutor>(*c);
  StoreOptions o;
  o.schema = "chstate_cluster_bench";
  o.endpoint = t.exec->endpoint();
  if (c->hosts.size() > 1) {
    o.hosts = c->hosts;  // the core picks the host of every request
    o.endpoint.clear();
  }
  o.lock.timeout_ms = 60000;
  o.lock.retry_ms = 10;
  o.cluster.name = cluster;
  absl::StatusOr<Statements> statements = Statements::Create(Dialect::kClickHouse18, o.schema, o.table, o.cluster);
  if (!statements.ok()) return statements.status();
  t.statements = *std::move(statements);
  if (!o.hosts.empty()) t.first_host = o.hosts.front();
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Create(o);
  if (!store.ok()) return store.status();
  t.store = *std::move(store);
  // As the adapter runs it: Meltano's retry of a second (lock_retry_ms sets
  // how often a lingering holder looks for waiters: at most every 200 ms, or
  // every half retry when shorter; at 10 ms it would look at every release).
  o.linger_locks = true;
  o.lock.retry_ms = kDefaultLockRetryMs;
  absl::StatusOr<std::unique_ptr<Store>> lingering = Store::Create(o);
  if (!lingering.ok()) return lingering.status();
  t.lingering = *std::move(lingering);
  // Init's ON CLUSTER DDL waits for every host (code 159 with one down): the run with a
  // replica down (--skip-init) uses what the first run made.
  if (!init) return t;
  if (absl::StatusOr<Result> done = Drive(*t.store->Init(), *t.exec); !done.ok()) return done.status();
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

// One operation, run `n` times after one untimed warm-up; `op(i)` returns its status.
absl::StatusOr<Stats> Measure(int n, const std::function<absl::Status(int)>& op) {
  if (absl::Status s = op(n); !s.ok()) return s;
  std::vector<double> ms;
  Sent sent;
  g_sent = &sent;
  for (int i = 0; i < n; ++i) {
    int64_t t0 = MonoNs();
    absl::Status s = op(i);
    if (!s.ok()) {
      g_sent = nullptr;
      return s;
    }
    ms.push_back((MonoNs() - t0) / 1e6);
  }
  g_sent = nullptr;
  Stats st = Summarise(ms);
  AddSent(sent, n, &st);
  return st;
}

// Two operations measured in turns (a, b, a, b, ...) after one untimed
// warm-up of each, so that both see the same load on a shared machine: the
// ratio of an operation to its floor.
absl::StatusOr<std::pair<Stats, Stats>> MeasureInTurns(int n, const std::function<absl::Status(int)>& a,
                                                       const std::function<absl::Status(int)>& b) {
  if (absl::Status s = a(n); !s.ok()) return s;
  if (absl::Status s = b(n); !s.ok()) return s;
  std::vector<double> ms[2];
  Sent sent[2];
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < 2; ++k) {
      g_sent = &sent[k];
      int64_t t0 = MonoNs();
      absl::Status s = (k == 0 ? a : b)(i);
      g_sent = nullptr;
      if (!s.ok()) return s;
      ms[k].push_back((MonoNs() - t0) / 1e6);
    }
  }
  std::pair<Stats, Stats> out{Summarise(ms[0]), Summarise(ms[1])};
  AddSent(sent[0], n, &out.first);
  AddSent(sent[1], n, &out.second);
  return out;
}

int Run(int single_port, const std::string& cluster_hosts, const std::string& cluster, int iterations,
        const std::string& title, bool init) {
  using Where = std::map<std::string, std::string>;
  std::vector<Target> targets;
  for (auto [label, where, env, name] :
       {std::make_tuple("one server", Where{{"host", "127.0.0.1"}, {"port", absl::StrCat(single_port)}},
                        "CHSTATE_BENCH_SINGLE_PASSWORD", std::string()),
        std::make_tuple("cluster", Where{{"host", cluster_hosts}}, "CHSTATE_BENCH_CLUSTER_PASSWORD", cluster)}) {
    absl::StatusOr<Target> t = Connect(label, where, env, name, init);
    if (!t.ok()) {
      std::cerr << "cluster_bench: " << label << ": " << t.status() << "\n";
      return 1;
    }
    targets.push_back(*std::move(t));
  }
  const char* kOps[] = {"get", "set", "update", "update_linger", "update_raw", "lock", "delete"};
  const std::map<std::string, std::string> kNames = {{"get", "get"},
                                                     {"set", "set (takes the id's lock for the write)"},
                                                     {"update", "update (lock, get, set, unlock)"},
                                                     {"update_linger", "update as the Meltano adapter runs it (lock lingering, set)"},
                                                     {"update_raw", "its floor: the read and the (quorum) INSERT sent raw, one connection"},
                                                     {"lock", "lock + unlock"},
                                                     {"delete", "delete"}};
  std::map<std::string, std::vector<Stats>> results;
  bool failed = false;
  for (Target& t : targets) {
    Store& st = *t.store;
    native::HttpExecutor& ex = *t.exec;
    auto run = [&ex](std::unique_ptr<Task> task) { return Drive(*task, ex).status(); };
    if (absl::Status s = run(st.Set(Sample("bench:get", 0))); !s.ok()) {
      std::cerr << "cluster_bench: " << t.label << ": seeding: " << s << "\n";
      return 1;
    }
    std::map<std::string, std::function<absl::Status(int)>> ops = {
        {"get", [&](int) { return run(st.Get("bench:get")); }},
        {"set", [&](int i) { return run(st.Set(Sample("bench:set", i))); }},
        {"update", [&](int i) { return run(st.Update(Sample("bench:update", i))); }},
        // As the Meltano adapter runs Meltano's update() of a complete state:
        // acquire_lock, set, release_lock (the release lingers, the next
        // acquisition takes it back).
        {"update_linger",
         [&](int i) -> absl::Status {
           absl::StatusOr<Result> got = Drive(*t.lingering->AcquireLock("bench:linger"), ex);
           if (!got.ok()) return got.status();
           if (absl::Status w = run(t.lingering->Set(Sample("bench:linger", i))); !w.ok()) return w;
           return run(t.lingering->ReleaseLock("bench:linger", got->lock_id));
         }},
        // update()'s statements with no core in between: the state read
        // (sequentially consistent on the cluster) and the write (a quorum
        // INSERT), to the first host.
        {"update_raw",
         [&](int i) -> absl::Status {
           SqlRequest read = t.statements->GetState("bench:raw");
           MeltanoState next = Sample("bench:raw", i);
           SqlRequest write = t.statements->InsertState("bench:raw", std::nullopt, next.completed.dump(),
                                                        absl::StrCat("raw-", i));
           for (SqlRequest* r : {&read, &write}) {
             r->endpoint = t.first_host;
             if (g_sent != nullptr) {
               ++g_sent->requests;
               ++g_sent->purposes[r->purpose];
               for (const auto& [key, value] : r->url_params) g_sent->quorum_writes += key == "insert_quorum";
             }
             SqlResponse got = ex.Execute(*r);
             if (absl::Status c = CheckResponse(got, r->purpose); !c.ok()) return c;
           }
           return absl::OkStatus();
         }},
        {"lock",
         [&](int) -> absl::Status {
           absl::StatusOr<Result> got = Drive(*st.AcquireLock("bench:lock"), ex);
           if (!got.ok()) return got.status();
           return run(st.ReleaseLock("bench:lock", got->lock_id));
         }},
    };
    for (const char* op : kOps) {
      absl::StatusOr<Stats> s = Stats{};
      if (std::string(op) == "delete") {
        // Time the delete alone: set first, untimed (iteration -1 is the warm-up).
        std::vector<double> ms;
        Sent sent;
        for (int i = -1; i < iterations && s.ok(); ++i) {
          std::string id = absl::StrCat("bench:delete:", i);
          if (absl::Status w = run(st.Set(Sample(id, i + 1))); !w.ok()) {
            s = w;
            break;
          }
          int64_t t0 = MonoNs();
          g_sent = i >= 0 ? &sent : nullptr;
          absl::Status d = run(st.Delete(id));
          g_sent = nullptr;
          if (!d.ok()) {
            s = d;
            break;
          }
          if (i >= 0) ms.push_back((MonoNs() - t0) / 1e6);
        }
        if (s.ok()) {
          s = Summarise(ms);
          AddSent(sent, iterations, &*s);
        }
      } else if (std::string(op) == "update_linger") {
        // With its floor, in turns.
        absl::StatusOr<std::pair<Stats, Stats>> both = MeasureInTurns(iterations, ops[op], ops["update_raw"]);
        if (both.ok()) {
          s = both->first;
          results["update_raw"].push_back(both->second);
        } else {
          s = both.status();
          results["update_raw"].push_back(Stats{});
        }
      } else if (std::string(op) == "update_raw") {
        continue;  // measured with update_linger
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
      if (std::string(op) == "update_linger") (void)run(t.lingering->ReleaseLingering());
    }
  }
  std::cout << "## " << title << " (" << iterations
            << " iterations per operation, ClickHouse 18.16, loopback)\n\n"
            << "Cluster hosts, in the order the client tries them: " << cluster_hosts << "\n\n"
            << "| operation | one server p50 / p99 ms | cluster p50 / p99 ms | cluster / one server (p50) | "
               "cluster requests (quorum writes) per op |\n"
            << "|---|---|---|---|---|\n";
  auto ratio = [](const Stats& a, const Stats& b) { return a.p50 > 0 ? b.p50 / a.p50 : 0.0; };
  for (const char* op : kOps) {
    const Stats& a = results[op][0];
    const Stats& b = results[op][1];
    std::cout << absl::StrFormat("| %s | %.2f / %.2f | %.2f / %.2f | %.1fx | %.2f (%.2f) |\n", kNames.at(op), a.p50,
                                 a.p99, b.p50, b.p99, ratio(a, b), b.requests, b.quorum_writes);
  }
  std::cout << "\nRequests per operation on the cluster, by purpose:\n\n";
  for (const char* op : kOps) {
    if (!results[op][1].purposes.empty()) std::cout << "- " << op << ": " << results[op][1].purposes << "\n";
  }
  for (int target = 0; target < 2; ++target) {
    const Stats& adapter = results["update_linger"][target];
    const Stats& floor = results["update_raw"][target];
    std::cout << absl::StrFormat(
        "\n%s: update as the adapter runs it / its raw floor: %.2fx at p50 (%.2f / %.2f ms); goal: within 1.25x",
        targets[target].label, ratio(floor, adapter), adapter.p50, floor.p50);
  }
  for (const char* op : {"update", "update_linger"}) {
    const Stats& one = results[op][0];
    const Stats& many = results[op][1];
    std::cout << absl::StrFormat(
        "\ncluster %s / one-server %s: %.1fx at p50 (%.2f / %.2f ms), %.1fx at p99 (%.2f / %.2f ms); goal: within 3x",
        op, op, ratio(one, many), many.p50, one.p50, one.p99 > 0 ? many.p99 / one.p99 : 0.0, many.p99, one.p99);
  }
  std::cout << "\n\n";
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace chstate

int main(int argc, char** argv) {
  int single_port = 0, iterations = 30;
  std::string cluster, cluster_hosts, title = "chstate cluster mode: cost on one machine";
  bool init = true;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--skip-init") {
      init = false;
      continue;
    }
    if (i + 1 >= argc) {
      std::cerr << "cluster_bench: " << flag << " needs a value\n";
      return 2;
    }
    std::string value = argv[++i];
    bool ok = true;
    if (flag == "--single-port") {
      ok = absl::SimpleAtoi(value, &single_port);
    } else if (flag == "--cluster-hosts") {
      cluster_hosts = value;
    } else if (flag == "--cluster") {
      cluster = value;
    } else if (flag == "--iterations") {
      ok = absl::SimpleAtoi(value, &iterations) && iterations > 0;
    } else if (flag == "--title") {
      title = value;
    } else {
      ok = false;
    }
    if (!ok) {
      std::cerr << "cluster_bench: bad flag " << flag << " " << value << "\n";
      return 2;
    }
  }
  if (single_port <= 0 || cluster_hosts.empty() || cluster.empty()) {
    std::cerr << "usage: cluster_bench --single-port P --cluster-hosts H1:P1,H2:P2,H3:P3 --cluster NAME "
                 "[--iterations N] [--title TEXT] [--skip-init]\n"
                 "(passwords in CHSTATE_BENCH_SINGLE_PASSWORD and CHSTATE_BENCH_CLUSTER_PASSWORD)\n";
    return 2;
  }
  return chstate::Run(single_port, cluster_hosts, cluster, iterations, title, init);
}
