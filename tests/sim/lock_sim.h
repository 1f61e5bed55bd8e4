// Deterministic simulation of the per-state-id lock, in the style of
// quinn-proto's tests: several contenders in one process, each driving its
// own lock (a chstate::LockMachine, or a stand-in for the negative controls),
// against one simulated ClickHouse server (tests/sim/sim_server.h), on a
// simulated clock that jumps from event to event. Everything, from network
// delays to the order of simultaneous events, comes from one seed, so a
// failing schedule replays exactly.
//
//   chstate::sim::SimConfig config = *chstate::sim::ConfigByName("crashes");
//   chstate::sim::ScheduleResult r = chstate::sim::RunSchedule(config, /*seed=*/42);
//   if (!r.ok()) {
//     chstate::sim::RunOptions traced;
//     traced.trace = true;
//     std::cout << chstate::sim::RunSchedule(config, 42, traced).Report();
//   }
//
// Time the core does not control: every one-way network delay, and so the
// moment each request lands on the simulated server, is drawn from the seed,
// up to the configuration's max_delay_ms (D_max), whatever the lock's own
// constants are. The stated assumption under which the lock must be exclusive
// is "no one-way delay exceeds D_max, and D_max is below every contender's
// lease margin"; the "stress" configuration breaks it on purpose and must be
// caught.
//
// What is checked (ScheduleResult::violations):
// - Mutual exclusion, on the server: a holder's writes under the lock (the
//   user's state writes, sent only while LeaseValid like the store's, and the
//   machine's renewal INSERTs and release DROP) are requests that land on the
//   server after their delay. Each lock instance occupies the server from the
//   moment its CREATE ran there until the LAST of its writes landed; no write
//   of one lock instance may land while another instance occupies the server
//   (after the other's CREATE ran, before the other's last write landed).
//   The machine's own lease deadline plays no part in this check.
// - Acting only under a valid lease: the machine's DROP and renewal INSERT,
//   and the user's writes, are sent only before its lease deadline; a holder
//   that ignores its lease (negative control) is caught writing past it.
// - Stale takeover: a lock table is renamed to a tombstone only when its
//   holder's newest row is more than stale_ms old by the server's (true) clock.
// - Progress: every contender that did not crash completes its rounds before
//   the horizon; configurations without faults see no failure, loss or takeover.
// - The server recognised every statement.
#ifndef CHSTATE_TESTS_SIM_LOCK_SIM_H_
#define CHSTATE_TESTS_SIM_LOCK_SIM_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/defaults.h"
#include "core/lock.h"
#include "core/lock_machine.h"
#include "core/sql_request.h"
#include "core/task.h"

namespace chstate::sim {

// One thing a contender's lock asks of the simulation, in the order asked.
// A lock machine's LockOutput is its outcome first, then its next step (a
// request, or a timer: kArmTimer replaces any earlier one).
struct SimAction {
  enum class Kind { kRunSql, kArmTimer, kAcquired, kReleased, kFailed, kLost };
  Kind kind;
  SqlRequest request;   // kRunSql
  int64_t delay_ms = 0; // kArmTimer: fire OnTimer after this long
  absl::Status status;  // kFailed, kLost
  LockTimer timer = LockTimer::kNone;  // kArmTimer
};

// What a contender drives: LockMachine's inputs, its outputs as SimActions.
class SimLock {
 public:
  virtual ~SimLock() = default;
  virtual void Acquire(const Inputs& in) = 0;
  virtual void Release(const Inputs& in) = 0;
  virtual void OnResponse(const SqlResponse& response, const Inputs& in) = 0;
  virtual void OnTimer(const Inputs& in) = 0;
  virtual std::optional<SimAction> Poll() = 0;
  virtual bool LeaseValid(int64_t now_ms) const = 0;
  virtual int64_t lease_deadline_ms() const = 0;
  virtual std::string lock_id() const = 0;
  virtual std::string StateName() const = 0;
  // Held with its lease running (renewal timers are armed in this state).
  virtual bool Held() const = 0;
  // The request Poll() returned last: the op it belongs to and the lock id
  // it acts under (a store's lingering lock may outlive the round's SimLock).
  virtual uint64_t RequestOp() const { return 0; }
  virtual std::string RequestLockId() const { return lock_id(); }
  virtual void OnResponseToOp(const SqlResponse& response, uint64_t /*op*/, const Inputs& in) {
    OnResponse(response, in);
  }
};

// A SimLock that queues its actions for Poll(): the plumbing of the
// stand-ins (tests/sim/naive_lock.h, tests/sim/python_backend_lock.h).
class QueuedSimLock : public SimLock {
 public:
  std::optional<SimAction> Poll() override {
    if (out_.empty()) return std::nullopt;
    SimAction a = std::move(out_.front());
    out_.pop_front();
    return a;
  }

 protected:
  void EmitSql(SqlRequest r) {
    SimAction a{SimAction::Kind::kRunSql};
    a.request = std::move(r);
    out_.push_back(std::move(a));
  }
  void EmitTimer(int64_t ms) { out_.push_back(SimAction{SimAction::Kind::kArmTimer, {}, ms}); }
  void EmitFailed(absl::Status why) { out_.push_back(SimAction{SimAction::Kind::kFailed, {}, 0, std::move(why)}); }
  void Emit(SimAction::Kind kind) { out_.push_back(SimAction{kind}); }

 private:
  std::deque<SimAction> out_;
};

enum class LockKind {
  kMachine,  // chstate::LockMachine: the lock under test
  kStore,    // the same lock through a whole chstate::Store, pumped as a
             // chstate::Connection (its resends, renewals by timeout, release)
  kNaive,    // negative control: tests/sim/naive_lock.h
};

struct SimConfig {
  std::string name;
  LockKind lock = LockKind::kMachine;

  // Contenders per schedule (drawn from the seed) and acquisitions each.
  int min_contenders = 2;
  int max_contenders = 3;
  int rounds = 2;

  // Lock settings. retry_ms is drawn from [retry_min_ms, options.retry_ms].
  LockOptions options{/*timeout_ms=*/120000, /*retry_ms=*/1000, /*stale_ms=*/5000};
  int64_t retry_min_ms = 200;
  // Draw stale_ms from [stale_min_ms, options.stale_ms] instead (any
  // millisecond value unless whole_second_stale). 0: use options.stale_ms.
  int64_t stale_min_ms = 0;
  bool whole_second_stale = false;
  // Each contender draws its own stale window and retry (as processes with
  // different settings would); otherwise they share one draw.
  bool per_contender_settings = false;

  // Network: each direction of each request takes a delay drawn from the
  // seed, up to max_delay_ms (D_max), mostly much less. It is a property of
  // the simulated network, not derived from the lock's constants. The lease
  // argument assumes D_max below the lease margin of every contender; honest
  // configurations state a D_max that meets it, "stress" one that does not.
  int64_t max_delay_ms = 0;
  // The draw: with quick_delay_prob up to D_max / quick_delay_divisor, else
  // up to D_max.
  double quick_delay_prob = 0.75;
  int64_t quick_delay_divisor = 4;
  // A request's answer is lost with this probability: the statement either
  // never arrived or ran and its answer vanished (the client gets a transport
  // failure with maybe_delivered either way).
  double lost_prob = 0;

  // Server.
  double create_visibility_prob = 0;
  int64_t create_visibility_max_ms = 0;
  double missing_table_empty_prob = 0;
  double database_missing_prob = 0;  // per schedule: the schema must be created first
  int64_t dropped_race_ms = 0;       // code 218 for a table dropped this recently
  int64_t union_now_spread_ms = 0;   // the UNION's halves read now() this far apart
  int64_t insert_visibility_max_ms = 0;  // naive lock's ReplacingMergeTree inserts
  int64_t merge_every_max_ms = 0;        // background merges (0: none)

  // Cluster mode: the lock as claims (core/claims_lock.h) in a replicated
  // table, with what replicas do to quorum inserts and reads
  // (tests/sim/sim_server.h ServerOptions: 286, 285, 319 with the row
  // landing late or never, 289).
  bool cluster = false;
  double quorum_busy_prob = 0;
  double too_few_replicas_prob = 0;
  double quorum_unknown_prob = 0;
  int64_t quorum_unknown_max_ms = 0;
  double lagging_read_prob = 0;
  // Cluster mode: periods when the replica the claims are read from lags
  // (every claims read answered 289), one starting up to lag_every_max_ms
  // after the last one ended and lasting 1..lag_max_ms (0: none).
  int64_t lag_every_max_ms = 0;
  int64_t lag_max_ms = 0;
  // Periods when the server refuses every connection (nothing arrives, the
  // client sees "connection refused", maybe_delivered false), one starting
  // up to refuse_every_max_ms after the last one ended and lasting
  // 1..refuse_max_ms (0: none).
  int64_t refuse_every_max_ms = 0;
  int64_t refuse_max_ms = 0;
  // Cluster mode: a pruner, as an acquisition that found many old claims
  // runs it (Store), every 1..prune_every_max_ms (0: never) from a claims
  // read that ran at that moment: it removes the claims that read found
  // prunable (LockInspection::dead), by Statements::PruneClaims landing a
  // round trip later, each row going up to prune_lag_max_ms after that (a
  // mutation, part by part). Negative control: prune_live_claims removes
  // every claim the read found, live ones too.
  int64_t prune_every_max_ms = 0;
  int64_t prune_lag_max_ms = 0;
  bool prune_live_claims = false;

  // Each contender crashes with this probability at a random moment: it
  // stops delivering any input (its requests in flight still arrive).
  double crash_prob = 0;

  // Each contender's clock is true time plus an offset up to this (either
  // sign). Clock rates are equal.
  int64_t max_clock_offset_ms = 0;
  // ... and runs at a rate off true time by up to this many parts per
  // million (either sign), drawn per contender: leases are measured on it.
  int64_t max_clock_rate_ppm = 0;

  // kStore in cluster mode: each contender's store is given a host list
  // (StoreOptions::hosts) of min_hosts..max_hosts endpoints (drawn per
  // schedule), all replicas of the one simulated server: a request goes to
  // the host its SqlRequest::endpoint names. One host, drawn from the seed,
  // is dead: it refuses every connection for the whole schedule. Each other
  // host refuses connections in periods of its own, one starting up to
  // host_refuse_every_max_ms after its last one ended and lasting
  // 1..host_refuse_max_ms (0: never). The stores mark failed hosts down for
  // host_down_ms; the simulation checks every send against the endpoints'
  // rule (core/endpoints.h) and counts the sends to the dead host.
  // 0 hosts: no host list (requests carry no endpoint; the default).
  int min_hosts = 0;
  int max_hosts = 0;
  int64_t host_refuse_every_max_ms = 0;
  int64_t host_refuse_max_ms = 0;
  int64_t host_down_ms = kDefaultHostDownMs;
  // Host lists (cluster mode): host i is replica i of the claims table, a
  // claims row reaching the replicas outside its quorum up to this much
  // later (ServerOptions::replicas; 0: one replica with every visible row).
  int64_t replica_fetch_max_ms = 0;
  // Negative control: the claims read says the table has one replica.
  bool replicas_understated = false;
  // kStore: each contender keeps one store across its rounds (linger implies
  // it), so what the store learnt about its hosts outlives a round.
  bool keep_store = false;

  // kStore only: each contender keeps one store across its rounds, with
  // linger_locks (a released lock lingers and is taken back), and between
  // rounds it is paused (no input at all: no timers, no answers) with
  // pause_prob for pause_max_ms at most, which can outlast its lease.
  bool linger = false;
  double pause_prob = 0;
  int64_t pause_max_ms = 0;

  // Holding: mostly up to short_hold_max_ms; with long_hold_prob between
  // stale_ms and 3 * stale_ms (renewals must keep the lease).
  int64_t short_hold_max_ms = 300;
  double long_hold_prob = 0;
  int64_t think_max_ms = 300;  // pause between a contender's rounds
  // Probability that the user gives up on an acquisition (calls Release
  // while it is still being acquired) at a random moment.
  double cancel_prob = 0;

  // While holding, the user writes state every 1..write_every_max_ms (each
  // write checked against LeaseValid first, as the store does, and landing on
  // the server after a network delay).
  int64_t write_every_max_ms = 150;

  // Each hold runs no renewals with this probability, as a store task does
  // (its writes check the lease instead): the lease then runs out while
  // the holder may still be writing, and a taker moves the lock.
  double withhold_renewals_prob = 0;
  // Renewal INSERTs that stall: with this probability a renewal lands
  // slow_renewal_min_ms..slow_renewal_max_ms after it was sent, beyond D_max
  // (negative control (b) only: it breaks the assumption for renewals).
  double slow_renewal_prob = 0;
  int64_t slow_renewal_min_ms = 0;
  int64_t slow_renewal_max_ms = 0;

  // Negative control: the holder ignores its lease (keeps writing until it
  // releases) and renewal timers are not delivered while it holds.
  bool ignore_lease = false;
  // Negative controls: the machine with one defence removed (test-only hook).
  LockDefectsForTesting defects;

  // A mixed fleet (kStore only): the odd contenders are processes of the
  // Python ClickHouse backend (tests/sim/python_backend_lock.h, this
  // version), the even ones chstate stores with python_locks, on one id of
  // one server. Exclusion is then judged by the holders' state writes alone
  // (a chstate table lock that yields to a Python holder held nothing).
  // Each Python step is held back with python_pause_prob for up to
  // python_pause_max_ms (a slow client, a server answering late).
  int python = 0;  // PythonLockVersion: 0 none, 1 published, 2 old
  double python_pause_prob = 0;
  int64_t python_pause_max_ms = 0;
  // Negative control: chstate's marker as before 2026-12-06 (ServerOptions::old_marker).
  bool old_marker = false;

  // Expectations.
  bool expect_violations = false;    // a negative control or the stress config
  bool expect_no_failures = false;   // no kFailed, kLost, or takeover at all
  bool check_progress = true;
  // Host lists: the dead host gets no more than one request per
  // host_down_ms per store (ScheduleResult::dead_host_budget) in all, even
  // counting the sends when every other host was down or tried. (Sends
  // against the host list's rule fail a schedule in every configuration.)
  bool expect_dead_host_within_budget = false;

  int64_t horizon_ms = 3600 * 1000;  // simulated time limit per schedule
  int64_t max_events = 200000;
};

struct RunOptions {
  bool trace = false;        // record a readable event trace (and ScheduleResult::observed)
  int contenders = 0;        // fix K (0: draw from the config's range)
  // With trace: the lock's state names in the trace ("(held)"); off, each
  // shows as "(-)", so that a trace says only what the lock did, not what
  // its states are called (tests/sim/trace_digest_test.cc).
  bool state_names = true;
};

struct ScheduleResult {
  std::string config;
  uint64_t seed = 0;
  int contenders = 0;
  int64_t events = 0;
  int64_t end_ms = 0;          // simulated duration
  int acquisitions = 0;        // kAcquired observed
  int releases = 0;            // kReleased
  int failures = 0;            // kFailed (the contender retries)
  int losses = 0;              // kLost
  int takeovers = 0;           // successful RENAME to a tombstone
  int renewals = 0;            // renewal INSERTs sent
  int revivals = 0;            // a lease that ran out became valid again
  int crashed = 0;
  int expired_on_acquire = 0;  // kAcquired with the lease already run out
  int64_t max_delay_ms = 0;    // D_max of this schedule
  int64_t longest_delay_ms = 0;  // the longest one-way delay actually drawn
  int writes_sent = 0;         // the user's state writes sent under the lock
  int writes_landed = 0;       // writes under the lock (state, renewal, DROP) that ran on the server
  int overlaps = 0;            // exclusion violations (also in violations)
  // A mixed fleet: overlaps not blamed on chstate. Two Python processes
  // holding at once (the backend's own race), and chstate holding while a
  // Python process held whose row a merge had already dropped in favour of
  // another Python row (the race's aftermath: that holder leaves no row).
  int python_overlaps = 0;
  int orphan_overlaps = 0;
  // ... and chstate holding while a Python process held whose row chstate's
  // own marker had merged away during a yield (docs/lock.md, the gap left).
  int marker_merge_overlaps = 0;
  int taken_back = 0;          // linger: acquisitions that took a lingering lock back
  int pauses = 0;              // linger: contenders paused between rounds
  int renewal_row_overlaps = 0;  // of which the late write was a renewal INSERT (a lock row, not state)
  int prunes = 0;              // cluster: prunes that landed, naming at least one claim
  // Host lists (SimConfig::min_hosts): the hosts each store was given, the
  // requests sent to a host, those sent to the dead host (and, of these, the
  // ones sent while the store's mark on it still ran, because every other
  // host was marked down or already tried for that request), and the most
  // the dead host may get from the stores: for each contender's store, one
  // per host_down_ms of its life (from its first request to its last) plus one.
  int hosts = 0;
  int host_sends = 0;
  int dead_host_sends = 0;
  int dead_host_sends_forced = 0;
  int dead_host_budget = 0;
  int host_refusals = 0;       // requests refused by a live host in one of its refusal periods
  int host_rule_breaks = 0;    // sends to another host than the rule picks (the first is a violation)
  std::vector<std::string> violations;
  std::vector<std::string> trace;
  // With trace: what crossed the lock's boundary, one line each: every
  // request a contender sent (its SQL, URL parameters, idempotence and lease
  // deadline) and every answer it was given (status, code, body, transport
  // error), with the true time. The trace has the rest (timers, outcomes).
  std::vector<std::string> observed;

  bool ok() const { return violations.empty(); }
  // Seed, counts, violations and (when recorded) the trace.
  std::string Report() const;
};

ScheduleResult RunSchedule(const SimConfig& config, uint64_t seed, const RunOptions& run = {});

// The configurations the test runs, by name: "no-faults",
// "delays-and-losses", "visibility", "visibility-renewals", "cancels",
// "crashes", "clock-offsets", "long-holds", "many-contenders",
// "mixed-settings", "odd-stale", "floor", "everything", "store-holds", the
// same through whole stores ("store/NAME"),
// "extreme-visibility" (beyond
// realistic bounds; not in the test); the negative controls "naive-rmt",
// "ignore-lease", "zero-margin", "renewal-accepts-any-holder" and
// "ignore-holder-window"; and "stress" (delays beyond D_max's assumption).
// The last six have expect_violations set.
std::vector<SimConfig> Configs();
std::optional<SimConfig> ConfigByName(const std::string& name);

// Totals over many schedules.
struct Summary {
  std::string config;
  int64_t schedules = 0;
  int64_t failed_schedules = 0;
  int64_t events = 0;
  int64_t acquisitions = 0;
  int64_t takeovers = 0;
  int64_t failures = 0;
  int64_t losses = 0;
  int64_t crashed = 0;
  int64_t revivals = 0;
  int64_t writes_landed = 0;
  int64_t overlaps = 0;
  int64_t renewal_row_overlaps = 0;
  int64_t python_overlaps = 0;
  int64_t orphan_overlaps = 0;
  int64_t marker_merge_overlaps = 0;
  int64_t prunes = 0;
  int64_t host_sends = 0;
  int64_t dead_host_sends = 0;
  int64_t dead_host_sends_forced = 0;
  int64_t dead_host_budget = 0;
  int64_t host_refusals = 0;
  int64_t host_rule_breaks = 0;
  int64_t taken_back = 0;
  int64_t pauses = 0;
  int64_t longest_delay_ms = 0;
  int max_contenders = 0;
  int64_t violations = 0;
  std::vector<uint64_t> failing_seeds;  // the first few

  void Add(const ScheduleResult& r);
  // Host lists: the sends to hosts and to the dead one (empty without hosts).
  std::string HostsLine() const;
};

// A fixed-width table of summaries (one line each, plus a total).
std::string FormatSummaries(const std::vector<Summary>& rows);

}  // namespace chstate::sim

#endif  // CHSTATE_TESTS_SIM_LOCK_SIM_H_
