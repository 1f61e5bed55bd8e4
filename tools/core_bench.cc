// What the core itself costs per operation, with no I/O: a store pumped
// through a Connection whose every request is answered at once with a
// scripted ClickHouse answer (the same answers each run). It measures the
// core's own work (building statements, the operation's state machine, the
// lock machine, parsing answers), which is what a change to the core's
// shape can change; the server's and the network's time are measured by
// tools/bench and tools/update_bench.py.
//
//   bazel run -c opt //tools:core_bench -- [--ops N] [--only get|set|update|list] [--rounds R]
//   valgrind --tool=callgrind bazel-bin/tools/core_bench --only update --ops 500 --rounds 1
//       # instructions, not seconds: the same count whatever else the machine does
//
// Prints, per operation kind, the wall time per operation (median of 5
// rounds) and the requests it sent.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/connection.h"
#include "core/lock.h"
#include "core/state.h"
#include "core/store.h"

namespace chstate {
namespace {

const std::string kRandom(32, '\x5a');

SqlResponse Ok(std::string body) {
  SqlResponse r;
  r.http_status = 200;
  r.body = std::move(body);
  return r;
}

// A server that agrees with everything: the lock is free and ours once
// created, the state exists.
SqlResponse Answer(const SqlRequest& req, int64_t now_s) {
  const std::string& p = req.purpose;
  if (p == "select_version") return Ok("18.16.1\t1\n");
  if (p == "get_state") return Ok("{}\t{\"singer_state\":{\"bookmarks\":{\"orders\":{\"updated_at\":\"2026-12-05\"}}}}\n");
  if (p == "inspect_lock") {
    return Ok(absl::StrCat(MakeLockId(kRandom), "\t0\t", now_s, "\t", now_s, "\t300\n\t255\t", now_s, "\t", now_s,
                           "\t0\n"));
  }
  if (p == "list_state_ids") return Ok("dev:a\t1\ndev:b\t1\n");
  if (p == "pending_mutations") return Ok("0\n");
  return Ok("");
}

struct Kind {
  const char* name;
  std::function<std::unique_ptr<Task>(Store&)> make;
};

MeltanoState Incoming() {
  MeltanoState s;
  s.state_id = "dev:tap-orders-to-target-warehouse";
  s.partial = nlohmann::json::parse(R"({"singer_state":{"bookmarks":{"orders":{"updated_at":"2026-12-05T00:00:01Z"}}}})");
  return s;
}

// Runs `n` operations of `kind` on one store; returns seconds and requests.
std::pair<double, int64_t> Run(const Kind& kind, int n) {
  StoreOptions o;
  o.lock.stale_ms = 300000;
  o.lock.timeout_ms = 10000;
  o.history_days = 0;
  std::unique_ptr<Store> store = *Store::Create(o);
  Connection conn(store.get());
  int64_t now_ms = 1'000'000;
  int64_t requests = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    conn.Start(kind.make(*store), {now_ms, kRandom});
    for (;;) {
      if (std::optional<Transmit> t = conn.PollTransmit()) {
        ++requests;
        now_ms += 1;
        if (!conn.HandleResponse(t->op, Answer(t->request, now_ms / 1000), {now_ms, kRandom}).ok()) std::abort();
        continue;
      }
      if (std::optional<OpEvent> e = conn.PollEvent()) {
        if (!e->ok) {
          std::fprintf(stderr, "%s failed: %s\n", kind.name, e->status.ToString().c_str());
          std::exit(1);
        }
        break;
      }
      if (std::optional<int64_t> at = conn.PollTimeout()) {
        now_ms = std::max(now_ms, *at);
        conn.HandleTimeout({now_ms, kRandom});
        continue;
      }
      std::fprintf(stderr, "%s stalled\n", kind.name);
      std::exit(1);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {secs, requests};
}

}  // namespace
}  // namespace chstate

int main(int argc, char** argv) {
  using namespace chstate;
  int n = 20000;
  std::string only;
  int rounds = 5;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--ops" && !absl::SimpleAtoi(argv[i + 1], &n)) return 2;
    if (std::string(argv[i]) == "--only") only = argv[i + 1];
    if (std::string(argv[i]) == "--rounds" && !absl::SimpleAtoi(argv[i + 1], &rounds)) return 2;
  }
  const std::vector<Kind> kinds = {
      {"get", [](Store& s) { return s.Get("dev:tap-orders-to-target-warehouse"); }},
      {"set", [](Store& s) { return s.Set(Incoming()); }},
      {"update", [](Store& s) { return s.Update(Incoming()); }},
      {"list", [](Store& s) { return s.List(std::string("dev:*")); }},
  };
  std::printf("| op | ns per op (median of %d) | requests per op |\n|---|---:|---:|\n", rounds);
  for (const Kind& k : kinds) {
    if (!only.empty() && only != k.name) continue;
    std::vector<double> per_op;
    int64_t requests = 0;
    for (int round = 0; round < rounds; ++round) {
      auto [secs, reqs] = Run(k, n);
      per_op.push_back(secs * 1e9 / n);
      requests = reqs;
    }
    std::sort(per_op.begin(), per_op.end());
    std::printf("| %s | %.0f | %.2f |\n", k.name, per_op[per_op.size() / 2], static_cast<double>(requests) / n);
  }
  return 0;
}
