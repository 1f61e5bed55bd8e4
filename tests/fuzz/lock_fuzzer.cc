// Fuzzes the table lock (core/table_lock.h, made by core/lock_machine.h) against the simulated
// ClickHouse server of tests/sim: the fuzz input decides everything the
// seeded simulation draws at random - each contender's settings and clock
// offset, the server's adversarial knobs, and, step by step, which event
// happens next (an acquire, a release or cancel, an answer delivered, lost
// or never sent, a timer firing late, time jumping, a crash and restart).
//
// Properties (the same as tests/sim's checker, evaluated after every input):
// - never two contenders that may act under the lock at the same true time
//   (observed kAcquired, not released, not crashed, LeaseValid by its own
//   clock);
// - DROP and renewal INSERT are only sent while the sender's lease is valid;
// - a lock table is renamed to a tombstone only when its holder's newest row
//   is older than that holder's stale window by the server's clock;
// - one SQL request in flight per machine; nothing after a terminal action;
//   timers are never negative; no "misuse" failure; the server recognises
//   every statement; and nothing crashes (ASan/UBSan).
//
// Statements run at the server the moment they are sent (or never), so every
// request arrives within the lease margin, which the algorithm assumes
// (docs/lock.md); answers may come back arbitrarily late or not at all.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "absl/strings/str_cat.h"
#include "core/lock_machine.h"
#include "core/statements.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/sim/sim_server.h"

namespace {

using chstate::LockOutput;
using chstate::LockMachine;
using chstate::SqlRequest;
using chstate::SqlResponse;

constexpr int64_t kEpochMs = 1700000000000;  // the server's clock starts here
constexpr int kMaxSteps = 3000;
const char kStateId[] = "dev:tap-fuzz-to-target-fuzz";

// Totals over the run, printed at exit when CHSTATE_FUZZ_STATS is set (to
// see that the inputs really reach acquisitions, takeovers and losses).
struct Stats {
  int64_t inputs = 0, acquired = 0, released = 0, failed = 0, lost = 0, takeovers = 0, overlapping_checks = 0;
  ~Stats() {
    if (std::getenv("CHSTATE_FUZZ_STATS") == nullptr) return;
    std::fprintf(stderr,
                 "lock_fuzzer totals: %lld inputs, %lld acquired, %lld released, %lld failed, %lld lost, "
                 "%lld takeovers, %lld exclusion checks\n",
                 (long long)inputs, (long long)acquired, (long long)released, (long long)failed, (long long)lost,
                 (long long)takeovers, (long long)overlapping_checks);
  }
} stats;

struct Pending {
  SqlResponse answer;
  int64_t ready_ms = 0;  // true time the answer can arrive
  std::string purpose;
};

struct Contender {
  chstate::LockOptions options;
  int64_t offset_ms = 0;
  std::unique_ptr<LockMachine> lock;
  bool crashed = false;
  bool terminal = true;  // no machine running
  bool acquired = false;
  bool release_called = false;  // the user released (or cancelled)
  std::optional<Pending> in_flight;
  std::optional<int64_t> timer_true_ms;
};

class Harness {
 public:
  explicit Harness(FuzzedDataProvider& in) : in_(in) {}

  void Run() {
    Setup();
    for (int step = 0; step < kMaxSteps && in_.remaining_bytes() > 0; ++step) Step();
    FUZZ_CHECK(server_->unrecognized().empty(), "the server did not recognise: " + server_->unrecognized()[0]);
  }

 private:
  void Setup() {
    rng_.seed(in_.ConsumeIntegral<uint64_t>());
    t_ = kEpochMs + in_.ConsumeIntegralInRange<int64_t>(0, 999);
    const int k = in_.ConsumeIntegralInRange<int>(2, 4);
    cs_.resize(k);
    int64_t min_stale = INT64_MAX;
    for (Contender& c : cs_) {
      c.options.stale_ms = in_.ConsumeIntegralInRange<int64_t>(1000, 20000);
      c.options.retry_ms = in_.ConsumeIntegralInRange<int64_t>(1, 3000);
      c.options.timeout_ms = in_.ConsumeIntegralInRange<int64_t>(0, 60000);
      c.offset_ms = in_.ConsumeIntegralInRange<int64_t>(-3600000, 3600000);
      min_stale = std::min(min_stale, c.options.stale_ms);
    }
    const chstate::Dialect dialect =
        in_.ConsumeBool() ? chstate::Dialect::kModern : chstate::Dialect::kClickHouse18;
    st_.emplace(*chstate::Statements::Create(dialect, "meltano", "state"));
    chstate::sim::ServerOptions so;
    so.schema = "meltano";
    so.dialect = dialect;
    so.database_exists = in_.ConsumeIntegralInRange<int>(0, 3) != 0;
    // Within the assumption that a creation row is visible well within the
    // window (tests/sim's "visibility" configurations use 0.4 of it).
    so.create_visibility_prob = in_.ConsumeProbability<double>();
    so.create_visibility_max_ms = min_stale * 2 / 5;
    so.missing_table_empty_prob = in_.ConsumeProbability<double>();
    so.dropped_race_ms = in_.ConsumeIntegralInRange<int64_t>(0, 300);
    so.union_now_spread_ms = in_.ConsumeIntegralInRange<int64_t>(0, 500);
    server_ = std::make_unique<chstate::sim::SimServer>(so, &rng_);
    server_->on_rename = [this](const std::string& from, const std::string&, const chstate::sim::Table& moved,
                                int64_t now) { CheckTakeover(from, moved, now); };
  }

  chstate::Inputs In(const Contender& c) {
    chstate::Inputs in;
    in.now_ms = t_ + c.offset_ms;
    std::uniform_int_distribution<int> byte(0, 255);
    for (int i = 0; i < 16; ++i) in.random.push_back(static_cast<char>(byte(rng_)));
    return in;
  }

  void Step() {
    const int op = in_.ConsumeIntegralInRange<int>(0, 7);
    Contender& c = cs_[in_.ConsumeIntegralInRange<size_t>(0, cs_.size() - 1)];
    const size_t who = &c - cs_.data();
    switch (op) {
      case 0: {  // a (new) acquisition; a crashed process comes back
        if (!c.terminal && !c.crashed) return;
        c = Contender{c.options, c.offset_ms};
        c.lock = chstate::MakeLockMachine(*st_, kStateId, c.options);
        c.terminal = false;
        Deliver(who, [&](const chstate::Inputs& in) { return c.lock->Acquire(in); });
        return;
      }
      case 1:
      case 2: {  // the answer arrives (possibly late)
        if (c.crashed || !c.in_flight) return;
        Pending p = std::move(*c.in_flight);
        c.in_flight.reset();
        t_ = std::max(t_, p.ready_ms);
        Deliver(who, [&](const chstate::Inputs& in) { return c.lock->OnResponse(p.answer, in); });
        return;
      }
      case 3: {  // the timer fires (possibly late)
        if (c.crashed || !c.timer_true_ms) return;
        t_ = std::max(t_, *c.timer_true_ms);
        c.timer_true_ms.reset();
        Deliver(who, [&](const chstate::Inputs& in) { return c.lock->OnTimer(in); });
        return;
      }
      case 4: {  // the user releases, or gives up while acquiring
        if (c.crashed || c.terminal || c.release_called) return;
        c.release_called = true;
        Deliver(who, [&](const chstate::Inputs& in) { return c.lock->Release(in); });
        return;
      }
      case 5:  // time passes
        t_ += in_.ConsumeIntegralInRange<int64_t>(0, 1) ? in_.ConsumeIntegralInRange<int64_t>(0, 500)
                                                        : in_.ConsumeIntegralInRange<int64_t>(0, 30000);
        CheckExclusion();
        return;
      case 6:  // the process dies
        if (!c.terminal) c.crashed = true;
        CheckExclusion();
        return;
      default: {  // run everything due next, as a fair scheduler would
        int64_t next = INT64_MAX;
        size_t target = cs_.size();
        bool timer = false;
        for (size_t i = 0; i < cs_.size(); ++i) {
          const Contender& d = cs_[i];
          if (d.crashed || d.terminal) continue;
          if (d.in_flight && d.in_flight->ready_ms < next) next = d.in_flight->ready_ms, target = i, timer = false;
          if (d.timer_true_ms && *d.timer_true_ms < next) next = *d.timer_true_ms, target = i, timer = true;
        }
        if (target == cs_.size()) return;
        Contender& d = cs_[target];
        t_ = std::max(t_, next);
        if (timer) {
          d.timer_true_ms.reset();
          Deliver(target, [&](const chstate::Inputs& in) { return d.lock->OnTimer(in); });
        } else {
          Pending p = std::move(*d.in_flight);
          d.in_flight.reset();
          Deliver(target, [&](const chstate::Inputs& in) { return d.lock->OnResponse(p.answer, in); });
        }
      }
    }
  }

  template <typename F>
  void Deliver(size_t who, F input) {
    Contender& c = cs_[who];
    const chstate::Inputs in = In(c);
    Take(who, in.now_ms, input(in));
    CheckExclusion();
  }

  // The machine's one output for the input just given: its outcome, then
  // its next step.
  void Take(size_t who, int64_t now, LockOutput o) {
    Contender& c = cs_[who];
    FUZZ_CHECK(!c.terminal || (o.outcome == LockOutput::Outcome::kNone && o.next == LockOutput::Next::kNone),
               "an action after the machine finished");
    switch (o.outcome) {
      case LockOutput::Outcome::kNone:
        break;
      case LockOutput::Outcome::kAcquired:
        // Acquired after the user cancelled: the machine lets go by itself
        // and the user never acts under it.
        if (!c.release_called) c.acquired = true;
        ++stats.acquired;
        break;
      case LockOutput::Outcome::kReleased:
      case LockOutput::Outcome::kFailed:
      case LockOutput::Outcome::kLost:
        ++(o.outcome == LockOutput::Outcome::kReleased ? stats.released
           : o.outcome == LockOutput::Outcome::kFailed ? stats.failed
                                                        : stats.lost);
        FUZZ_CHECK(o.status.message().find("misuse") == absl::string_view::npos,
                   "misuse reported: " + o.status.ToString());
        c.terminal = true;
        c.acquired = false;
        c.in_flight.reset();
        c.timer_true_ms.reset();
        FUZZ_CHECK(o.next == LockOutput::Next::kNone, "an action after the machine finished");
        return;
    }
    switch (o.next) {
      case LockOutput::Next::kNone:
        break;
      case LockOutput::Next::kRunSql: {
        const std::string& purpose = o.request.purpose;
        FUZZ_CHECK(!c.in_flight, "two requests in flight: " + purpose + " while " + c.in_flight->purpose);
        if (purpose == "drop_lock" || purpose == "renew_lock") {
          FUZZ_CHECK(now < c.lock->lease_deadline_ms(), purpose + " sent after the lease deadline");
        }
        Pending p;
        p.purpose = purpose;
        // 0-1: normal; 2: the statement ran but its answer was lost;
        // 3: it never arrived (the connection failed first).
        const int fate = in_.ConsumeIntegralInRange<int>(0, 3);
        if (fate == 3) {
          p.answer.transport_ok = false;
          p.answer.maybe_delivered = in_.ConsumeBool();
          p.answer.transport_error = "connection refused (fuzz)";
          p.ready_ms = t_;
        } else {
          chstate::sim::Execution x = server_->Execute(o.request, t_);
          p.ready_ms = x.done_ms;
          if (fate == 2) {
            p.answer.transport_ok = false;
            p.answer.maybe_delivered = true;
            p.answer.transport_error = "connection reset (fuzz)";
          } else {
            p.answer = std::move(x.response);
          }
        }
        c.in_flight = std::move(p);
        break;
      }
      case LockOutput::Next::kWait:
        FUZZ_CHECK(o.wait_ms >= 0, "negative timer");
        c.timer_true_ms = t_ + o.wait_ms;
        break;
    }
  }

  bool MayAct(const Contender& c) const {
    // Negative control (tests/fuzz/run --control): a holder that ignores its
    // lease and acts until it releases must be caught overlapping.
    static const bool ignore_lease = std::getenv("CHSTATE_FUZZ_IGNORE_LEASE") != nullptr;
    return c.lock && !c.crashed && !c.terminal && c.acquired && !c.release_called &&
           (ignore_lease || c.lock->LeaseValid(t_ + c.offset_ms));
  }

  void CheckExclusion() {
    ++stats.overlapping_checks;
    int acting = 0;
    std::string who;
    for (size_t i = 0; i < cs_.size(); ++i) {
      if (MayAct(cs_[i])) {
        ++acting;
        absl::StrAppend(&who, " c", i, " (", chstate::LockStateName(cs_[i].lock->state()), ", lease to ",
                        cs_[i].lock->lease_deadline_ms() - cs_[i].offset_ms - kEpochMs, ")");
      }
    }
    FUZZ_CHECK(acting <= 1, absl::StrCat("two holders at t=", t_ - kEpochMs, ":", who));
  }

  // A takeover is legitimate only when the holder's newest row is older than
  // its stale window by the server's clock.
  void CheckTakeover(const std::string& from, const chstate::sim::Table& moved, int64_t now) {
    std::string holder;
    for (const chstate::sim::Row& r : moved.rows) {
      if (r.seq == 0 && r.visible_ms <= now) holder = r.lock_id;
    }
    ++stats.takeovers;
    if (holder.empty()) return;  // instance without a visible creation row: judged by table age
    int64_t newest = 0;
    for (const chstate::sim::Row& r : moved.rows) {
      if (r.lock_id == holder) newest = std::max(newest, r.stamped_ms);
    }
    int64_t stale = 0;
    for (const Contender& c : cs_) {
      if (c.lock && c.lock->lock_id() == holder) stale = c.options.stale_ms;
    }
    if (stale == 0) return;  // an earlier incarnation of a restarted contender
    FUZZ_CHECK(now - newest > stale, absl::StrCat("took over ", from, " only ", now - newest,
                                                  "ms after its holder's last row (window ", stale, "ms)"));
  }

  FuzzedDataProvider& in_;
  std::mt19937_64 rng_;
  int64_t t_ = 0;
  std::optional<chstate::Statements> st_;
  std::unique_ptr<chstate::sim::SimServer> server_;
  std::vector<Contender> cs_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  ++stats.inputs;
  Harness(in).Run();
  return 0;
}
