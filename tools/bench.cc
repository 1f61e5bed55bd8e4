// bench: latency and lock-contention benchmark of the chstate core driven by
// the native HTTP host, against a real ClickHouse. Prints Markdown tables.
//
//   # a throwaway server, the bench, then the server is stopped:
//   python3 tools/clickhouse_server.py run -- bazel run -c opt --symlink_prefix=/ //tools:bench
//   python3 tools/clickhouse_server.py run -- bazel run -c opt --symlink_prefix=/ //tools:bench -- --seconds 3
//   # or against a server you started (tools/clickhouse_server.py start DIR prints the variables):
//   env $(python3 tools/clickhouse_server.py start /tmp/ch) bazel run -c opt //tools:bench
//
// (--symlink_prefix=/ keeps an opt build from repointing bazel-bin, which
// tests/integration and tests/lock read their binaries from.)
//
// Connection: CHSTATE_TEST_HOST, CHSTATE_TEST_PORT, CHSTATE_TEST_USER,
// CHSTATE_TEST_PASSWORD (as tools/clickhouse_server.py prints them); --host,
// --port and --user override. The password is only read from the environment.
// Database "default"; everything is written under --schema (default
// chstate_bench), which is dropped before and after the run.
//
// Flags: --iterations N (100) per latency measurement, --seconds S (5) per
// contention run, --schema S, --hold-ms MS (0: how long a contender holds).
//
// Measurements (mean, p50, p99 in ms, and as a multiple of the floor):
//   floor            one keep-alive HTTP round trip of SELECT 1 (HttpExecutor::Execute)
//   acquire+release  AcquireLock then ReleaseLock of one id, uncontended
//   update           Store::Update of a small partial state (Meltano's per-STATE-message
//                    cost: lock, get, set, unlock)
//   get, set         plain Store::Get / Store::Set
//   contention       2, 4, 8 threads (each its own HttpExecutor and Store) acquiring and
//                    releasing one id for --seconds each, retry 10 ms; and 2 threads with
//                    the default retry of 1000 ms. Throughput, and the handoff latency:
//                    from one holder's ReleaseLock returning to the next AcquireLock
//                    returning (CLOCK_MONOTONIC, shared by the threads).
// Exit code 1 when any measurement hit an error (all are reported on stderr).
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/config.h"
#include "core/sql_request.h"
#include "core/state.h"
#include "core/store.h"
#include "hosts/native/executor.h"
#include <nlohmann/json.hpp>

namespace chstate {
namespace {

using native::HttpExecutor;
using native::RunTask;

int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

struct Flags {
  int64_t iterations = 100;
  int64_t seconds = 5;
  int64_t hold_ms = 0;
  std::string schema = "chstate_bench";
  std::string host, port, user;
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  std::map<std::string, int64_t*> ints = {
      {"--iterations", &f.iterations}, {"--seconds", &f.seconds}, {"--hold-ms", &f.hold_ms}};
  std::map<std::string, std::string*> strings = {
      {"--schema", &f.schema}, {"--host", &f.host}, {"--port", &f.port}, {"--user", &f.user}};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (arg == "--help" || arg == "-h") {
      return absl::InvalidArgumentError("help");
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
    }
    if (auto n = ints.find(arg); n != ints.end()) {
      if (!absl::SimpleAtoi(value, n->second) || *n->second < 0) {
        return absl::InvalidArgumentError(absl::StrCat(arg, " needs a non-negative integer"));
      }
    } else if (auto s = strings.find(arg); s != strings.end()) {
      *s->second = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag \"", arg, "\""));
    }
  }
  if (f.iterations < 1 || f.seconds < 1) return absl::InvalidArgumentError("--iterations and --seconds must be >= 1");
  return f;
}

absl::StatusOr<ConnectionConfig> Config(const Flags& f) {
  ConnectionConfig c;
  c.host = !f.host.empty() ? f.host : Env("CHSTATE_TEST_HOST");
  if (c.host.empty()) c.host = "127.0.0.1";
  std::string port = !f.port.empty() ? f.port : Env("CHSTATE_TEST_PORT");
  if (port.empty() || !absl::SimpleAtoi(port, &c.port)) {
    return absl::InvalidArgumentError(
        "no server: set CHSTATE_TEST_PORT (and HOST/USER/PASSWORD), e.g. from tools/clickhouse_server.py start DIR");
  }
  c.user = !f.user.empty() ? f.user : Env("CHSTATE_TEST_USER");
  c.password = Env("CHSTATE_TEST_PASSWORD");
  c.database = "default";
  return c;
}

// ---- statistics ----

struct Stats {
  size_t n = 0;
  double mean = 0, p50 = 0, p99 = 0, min = 0, max = 0;
};

// Nearest-rank percentiles.
Stats Summarize(std::vector<double> v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / v.size();
  auto rank = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * v.size())) - 1)]; };
  s.p50 = rank(0.50);
  s.p99 = rank(0.99);
  s.min = v.front();
  s.max = v.back();
  return s;
}

std::string Ms(double ms) { return absl::StrFormat("%.3f", ms); }
std::string Times(double x, double floor) { return floor > 0 ? absl::StrFormat("%.1f×", x / floor) : "-"; }

// ---- the run ----

class Bench {
 public:
  Bench(Flags flags, ConnectionConfig config) : f_(std::move(flags)), config_(std::move(config)) {}

  int Run() {
    exec_ = std::make_unique<HttpExecutor>(config_);
    StoreOptions o = BaseOptions();
    o.lock.retry_ms = 10;
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Create(o);
    if (!store.ok()) return Fatal("store options", store.status());
    store_ = *std::move(store);
    absl::StatusOr<Result> ping = RunTask(*store_->Ping(), *exec_);
    if (!ping.ok()) return Fatal("connecting", ping.status());
    DropSchema();
    if (absl::StatusOr<Result> init = RunTask(*store_->Init(), *exec_); !init.ok()) return Fatal("init", init.status());

    int64_t started = MonoNs();
    std::cout << "## chstate bench: ClickHouse " << ping->server_version << " at " << exec_->endpoint()
              << ", " << f_.iterations << " iterations, " << std::thread::hardware_concurrency() << " CPUs\n\n";

    Latencies();
    Contention();

    DropSchema();
    std::cout << "\nTotal bench time: " << absl::StrFormat("%.1f", (MonoNs() - started) / 1e9) << " s\n";
    if (!errors_.empty()) {
      std::cerr << errors_.size() << " error(s):\n";
      for (const std::string& e : errors_) std::cerr << "  " << e << "\n";
      return 1;
    }
    return 0;
  }

 private:
  StoreOptions BaseOptions() const {
    StoreOptions o;
    o.schema = f_.schema;
    o.endpoint = exec_ ? exec_->endpoint() : "";
    o.lock.timeout_ms = 60000;
    return o;
  }

  int Fatal(const std::string& what, const absl::Status& s) {
    std::cerr << "bench: " << what << ": " << s.ToString() << "\n";
    return 1;
  }

  void Error(const std::string& what, const absl::Status& s) {
    std::lock_guard<std::mutex> l(mu_);
    // Reported on stderr at the end, after the tables.
    errors_.push_back(absl::StrCat(what, ": ", s.ToString()));
  }

  void DropSchema() {
    SqlRequest drop;
    drop.sql = absl::StrCat("DROP DATABASE IF EXISTS `", f_.schema, "`");
    SqlResponse r = exec_->Execute(drop);
    if (!r.transport_ok || r.http_status != 200) {
      Error("dropping the bench schema", absl::UnknownError(r.transport_ok ? r.body : r.transport_error));
    }
  }

  // Times `op` (which returns an error or OK) `iterations` times after a few
  // warm-up runs; stops early (and says so) past 15 s.
  std::vector<double> Time(const std::string& name, const std::function<absl::Status()>& op, int warmup = 5) {
    for (int i = 0; i < warmup; ++i) {
      if (absl::Status s = op(); !s.ok()) {
        Error(absl::StrCat(name, " (warm-up)"), s);
        return {};
      }
    }
    std::vector<double> ms;
    int64_t give_up = MonoNs() + 15000000000LL;
    for (int64_t i = 0; i < f_.iterations; ++i) {
      int64_t t0 = MonoNs();
      absl::Status s = op();
      int64_t t1 = MonoNs();
      if (!s.ok()) {
        Error(absl::StrCat(name, " (iteration ", i, ")"), s);
        break;
      }
      ms.push_back((t1 - t0) / 1e6);
      if (t1 > give_up) {
        notes_.push_back(absl::StrCat(name, ": stopped after ", ms.size(), " iterations (15 s cap)"));
        break;
      }
    }
    return ms;
  }

  static absl::Status Ok(const absl::StatusOr<Result>& r) { return r.status(); }

  void Latencies() {
    HttpExecutor& ex = *exec_;
    Store& st = *store_;
    SqlRequest select1;
    select1.sql = "SELECT 1";
    select1.purpose = "bench_floor";
    std::vector<double> floor = Time("floor", [&]() -> absl::Status {
      SqlResponse r = ex.Execute(select1);
      if (!r.transport_ok) return absl::UnavailableError(r.transport_error);
      if (r.http_status != 200 || r.body != "1\n") {
        return absl::UnknownError(absl::StrCat("HTTP ", r.http_status, ": ", r.body.substr(0, 200)));
      }
      return absl::OkStatus();
    });

    const std::string lock_id = "bench:uncontended";
    std::vector<double> acquire_ms, release_ms;
    std::vector<double> acq_rel = Time("acquire+release", [&]() -> absl::Status {
      int64_t t0 = MonoNs();
      absl::StatusOr<Result> a = RunTask(*st.AcquireLock(lock_id), ex);
      if (!a.ok()) return a.status();
      int64_t t1 = MonoNs();
      absl::Status r = Ok(RunTask(*st.ReleaseLock(lock_id, a->lock_id), ex));
      int64_t t2 = MonoNs();
      acquire_ms.push_back((t1 - t0) / 1e6);
      release_ms.push_back((t2 - t1) / 1e6);
      return r;
    });
    // The first five were the warm-up.
    for (std::vector<double>* v : {&acquire_ms, &release_ms}) {
      v->erase(v->begin(), v->begin() + std::min<size_t>(5, v->size()));
    }

    // A realistic small state: what a tap emits as a partial STATE message.
    const std::string state_id = "dev:tap-postgres-to-target-clickhouse";
    MeltanoState base{state_id, nlohmann::json::object(),
                      {{"singer_state",
                        {{"bookmarks",
                          {{"public-users", {{"replication_key", "updated_at"},
                                             {"replication_key_value", "2024-05-01T00:00:00+00:00"}}},
                           {"public-orders", {{"replication_key", "id"}, {"replication_key_value", 1000}}}}}}}}};
    if (absl::Status s = Ok(RunTask(*st.Set(base), ex)); !s.ok()) Error("set (setup)", s);
    int64_t counter = 0;
    std::vector<double> update = Time("update", [&]() -> absl::Status {
      ++counter;
      MeltanoState incoming{state_id,
                            {{"singer_state",
                              {{"bookmarks",
                                {{"public-orders",
                                  {{"replication_key", "id"}, {"replication_key_value", 1000 + counter}}}}},
                               {"currently_syncing", "public-orders"}}}},
                            nlohmann::json::object()};
      return Ok(RunTask(*st.Update(incoming), ex));
    });
    std::vector<double> get = Time("get", [&]() -> absl::Status {
      absl::StatusOr<Result> r = RunTask(*st.Get(state_id), ex);
      if (r.ok() && !r->state) return absl::NotFoundError("the bench state is missing");
      return r.status();
    });
    std::vector<double> set = Time("set", [&]() -> absl::Status { return Ok(RunTask(*st.Set(base), ex)); });

    Stats fl = Summarize(floor);
    floor_p50_ = fl.p50;
    std::cout << "### Latency (ms; ×: multiple of the floor's mean / p50 / p99)\n\n"
              << "| measurement | n | mean | p50 | p99 | max | mean × | p50 × | p99 × |\n"
              << "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    auto row = [&](const std::string& name, const std::vector<double>& v) {
      Stats s = Summarize(v);
      std::cout << "| " << name << " | " << s.n << " | " << Ms(s.mean) << " | " << Ms(s.p50) << " | " << Ms(s.p99)
                << " | " << Ms(s.max) << " | " << Times(s.mean, fl.mean) << " | " << Times(s.p50, fl.p50) << " | "
                << Times(s.p99, fl.p99) << " |\n";
    };
    row("floor: `SELECT 1` keep-alive round trip", floor);
    row("uncontended acquire+release", acq_rel);
    row("&nbsp;&nbsp;of which AcquireLock", acquire_ms);
    row("&nbsp;&nbsp;of which ReleaseLock", release_ms);
    row("update() of a small partial state (lock, get, set, unlock)", update);
    row("plain Get", get);
    row("plain Set", set);
    std::cout << "\n";
  }

  struct Hold {
    int thread;
    int64_t asked_ns, acquired_ns, release_start_ns, released_ns;
  };

  void Contention() {
    std::cout << "### Contention on one state id (" << f_.seconds << " s per row, hold " << f_.hold_ms
              << " ms; handoff = next AcquireLock returning − previous ReleaseLock returning; floor p50 "
              << Ms(floor_p50_) << " ms)\n\n"
              << "| contenders | retry ms | acquisitions | acq/s | handoff mean | p50 | p99 | min | "
                 "handoffs to another thread | their mean | their p99 | per-thread acquisitions | overlaps | errors |\n"
              << "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n";
    for (int threads : {2, 4, 8}) ContentionRow(threads, 10);
    ContentionRow(2, 1000);
    std::cout << "\nTimes in ms. A waiting contender sleeps retry_ms between attempts, so a handoff to a waiting "
                 "thread costs up to retry_ms (about retry_ms/2 on average) plus a CREATE round trip, while the "
                 "releasing thread loops back at once and may win again (compare handoffs to another thread and the "
                 "per-thread spread). Meltano's default lock_retry_seconds is 1 s (the last row). A negative handoff: "
                 "the next holder's CREATE landed after the DROP but before the releaser's answer arrived. `overlaps` "
                 "counts acquisitions returning before the previous holder began its release (must be 0).\n";
    for (const std::string& n : notes_) std::cout << "\nNote: " << n << "\n";
  }

  void ContentionRow(int threads, int64_t retry_ms) {
    const std::string id = absl::StrCat("bench:contended-", threads, "-", retry_ms);
    std::vector<std::vector<Hold>> holds(threads);
    std::vector<std::string> thread_errors;
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    int64_t end_ns = 0;
    std::mutex err_mu;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        auto report = [&](const std::string& what, const absl::Status& s) {
          std::lock_guard<std::mutex> l(err_mu);
          thread_errors.push_back(absl::StrCat("thread ", t, " ", what, ": ", s.ToString()));
        };
        HttpExecutor ex(config_);
        StoreOptions o = BaseOptions();
        o.lock.retry_ms = retry_ms;
        o.lock.timeout_ms = (f_.seconds + 60) * 1000;
        absl::StatusOr<std::unique_ptr<Store>> store = Store::Create(o);
        absl::Status connected = store.ok() ? RunTask(*(*store)->Ping(), ex).status() : store.status();
        ++ready;
        if (!connected.ok()) {
          report("connecting", connected);
          return;
        }
        while (!go.load()) std::this_thread::yield();
        Store& st = **store;
        while (MonoNs() < end_ns) {
          Hold h{t, MonoNs(), 0, 0, 0};
          absl::StatusOr<Result> a = RunTask(*st.AcquireLock(id), ex);
          h.acquired_ns = MonoNs();
          if (!a.ok()) {
            report("acquire", a.status());
            return;
          }
          if (f_.hold_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(f_.hold_ms));
          h.release_start_ns = MonoNs();
          absl::StatusOr<Result> r = RunTask(*st.ReleaseLock(id, a->lock_id), ex);
          h.released_ns = MonoNs();
          if (!r.ok()) {
            report("release", r.status());
            return;
          }
          holds[t].push_back(h);
        }
      });
    }
    while (ready.load() < threads) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    int64_t start_ns = MonoNs();
    end_ns = start_ns + f_.seconds * 1000000000LL;
    go.store(true);
    for (std::thread& th : pool) th.join();

    std::vector<Hold> all;
    std::vector<size_t> per_thread;
    int64_t last_ns = start_ns;
    for (const auto& v : holds) {
      all.insert(all.end(), v.begin(), v.end());
      per_thread.push_back(v.size());
      for (const Hold& h : v) last_ns = std::max(last_ns, h.released_ns);
    }
    std::sort(all.begin(), all.end(), [](const Hold& a, const Hold& b) { return a.acquired_ns < b.acquired_ns; });
    std::vector<double> handoff, cross;
    int overlaps = 0;
    for (size_t i = 1; i < all.size(); ++i) {
      double h = (all[i].acquired_ns - all[i - 1].released_ns) / 1e6;
      handoff.push_back(h);
      if (all[i].thread != all[i - 1].thread) cross.push_back(h);
      if (all[i].acquired_ns < all[i - 1].release_start_ns) ++overlaps;
    }
    Stats hs = Summarize(handoff), cs = Summarize(cross);
    double secs = (last_ns - start_ns) / 1e9;
    auto [mn, mx] = std::minmax_element(per_thread.begin(), per_thread.end());
    std::cout << "| " << threads << " | " << retry_ms << " | " << all.size() << " | "
              << absl::StrFormat("%.1f", secs > 0 ? all.size() / secs : 0.0) << " | " << Ms(hs.mean) << " | "
              << Ms(hs.p50) << " | " << Ms(hs.p99) << " | " << Ms(hs.min) << " | " << cs.n << " | " << Ms(cs.mean)
              << " | " << Ms(cs.p99) << " | " << *mn << "–" << *mx << " | " << overlaps << " | "
              << thread_errors.size() << " |\n";
    for (const std::string& e : thread_errors) {
      std::lock_guard<std::mutex> l(mu_);
      errors_.push_back(absl::StrCat("contention ", threads, "×", retry_ms, "ms: ", e));
    }
    if (overlaps > 0) {
      Error(absl::StrCat("contention ", threads, "×", retry_ms, "ms"),
            absl::InternalError(absl::StrCat(overlaps, " overlapping holds: mutual exclusion violated")));
    }
  }

  Flags f_;
  ConnectionConfig config_;
  std::unique_ptr<HttpExecutor> exec_;
  std::unique_ptr<Store> store_;
  double floor_p50_ = 0;
  std::mutex mu_;
  std::vector<std::string> errors_;
  std::vector<std::string> notes_;
};

}  // namespace
}  // namespace chstate

int main(int argc, char** argv) {
  absl::StatusOr<chstate::Flags> flags = chstate::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << (flags.status().message() == "help" ? "" : absl::StrCat("bench: ", flags.status().message(), "\n"))
              << "usage: bench [--iterations N] [--seconds S] [--schema S] [--hold-ms MS] [--host H] [--port P] "
                 "[--user U]\n(connection from CHSTATE_TEST_HOST/PORT/USER/PASSWORD)\n";
    return 2;
  }
  absl::StatusOr<chstate::ConnectionConfig> config = chstate::Config(*flags);
  if (!config.ok()) {
    std::cerr << "bench: " << config.status().message() << "\n";
    return 2;
  }
  return chstate::Bench(*std::move(flags), *std::move(config)).Run();
}
