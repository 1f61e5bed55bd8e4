// The lock simulation's scheduler and checker (see lock_sim.h).
//
// One priority queue of events ordered by (true time, a random tie-breaker
// drawn from the seed, insertion order): simultaneous events run in an order
// the seed chooses, so different seeds explore different interleavings. The
// clock jumps to the next event. Contenders see true time plus their own
// offset; the server sees true time.
#include "tests/sim/lock_sim.h"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <queue>
#include <set>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_format.h"
#include "core/response.h"
#include "core/connection.h"
#include "core/statements.h"
#include "core/store.h"
#include "core/task.h"
#include "tests/sim/naive_lock.h"
#include "tests/sim/python_backend_lock.h"
#include "tests/sim/sim_server.h"

namespace chstate::sim {
namespace {

// Simulated true time starts here (a plausible Unix time in ms), plus a
// random fraction of a second so that whole-second boundaries fall anywhere.
constexpr int64_t kEpochMs = 1700000000000;
constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
constexpr char kStateId[] = "dev:tap-a-to-target-b";
constexpr size_t kMaxViolations = 20;

// The lock under test behind the SimLock interface.
class MachineLock : public SimLock {
 public:
  MachineLock(const Statements& st, LockOptions options, const LockDefectsForTesting& defects)
      : m_(MakeLockMachine(st, kStateId, options)) {
    m_->SetDefectsForTesting(defects);
  }
  void Acquire(const Inputs& in) override { Take(m_->Acquire(in)); }
  void Release(const Inputs& in) override { Take(m_->Release(in)); }
  void OnResponse(const SqlResponse& r, const Inputs& in) override { Take(m_->OnResponse(r, in)); }
  void OnTimer(const Inputs& in) override { Take(m_->OnTimer(in)); }
  std::optional<SimAction> Poll() override {
    if (out_.empty()) return std::nullopt;
    SimAction a = std::move(out_.front());
    out_.pop_front();
    return a;
  }
  bool LeaseValid(int64_t now_ms) const override { return m_->LeaseValid(now_ms); }
  int64_t lease_deadline_ms() const override { return m_->lease_deadline_ms(); }
  std::string lock_id() const override { return m_->lock_id(); }
  std::string StateName() const override { return LockStateName(m_->state()); }
  bool Held() const override { return m_->state() == LockState::kHeld; }

 private:
  // The machine's one output per input, as the simulation's actions.
  void Take(LockOutput o) {
    switch (o.outcome) {
      case LockOutput::Outcome::kNone: break;
      case LockOutput::Outcome::kAcquired: out_.push_back(SimAction{SimAction::Kind::kAcquired}); break;
      case LockOutput::Outcome::kReleased: out_.push_back(SimAction{SimAction::Kind::kReleased}); break;
      case LockOutput::Outcome::kFailed:
        out_.push_back(SimAction{SimAction::Kind::kFailed, {}, 0, std::move(o.status)});
        break;
      case LockOutput::Outcome::kLost:
        out_.push_back(SimAction{SimAction::Kind::kLost, {}, 0, std::move(o.status)});
        break;
    }
    switch (o.next) {
      case LockOutput::Next::kNone: break;
      case LockOutput::Next::kRunSql: {
        SimAction a{SimAction::Kind::kRunSql};
        a.request = std::move(o.request);
        out_.push_back(std::move(a));
        break;
      }
      case LockOutput::Next::kWait: {
        SimAction a{SimAction::Kind::kArmTimer, {}, o.wait_ms};
        a.timer = o.timer;
        out_.push_back(std::move(a));
        break;
      }
    }
  }

  std::unique_ptr<LockMachine> m_;
  std::deque<SimAction> out_;
};

// The lock through a whole store, as a host uses it: AcquireLock and
// ReleaseLock operations on a Connection, which resends per the transport
// policy and renews the held lock when called back at its PollTimeout. Its
// outputs become the machine's actions the simulation understands.
class StoreLock : public SimLock {
 public:
  StoreLock(const StoreOptions& o, std::string random) : random_(std::move(random)) {
    conn_ = std::make_shared<Connection>(*Store::Create(o));
    lock_id_ = MakeLockId(random_);  // every input carries the same bytes
  }
  // linger: a round over the contender's own store, kept across rounds; the
  // lock id is the one the acquisition reports (a lingering lock taken back
  // keeps the id of the round that created it).
  StoreLock(std::shared_ptr<Connection> conn, std::shared_ptr<std::string> held_id, std::string random)
      : random_(std::move(random)), conn_(std::move(conn)), shared_(true), held_id_(std::move(held_id)) {
    lock_id_ = MakeLockId(random_);
  }
  bool TookBack() const { return took_back_; }
  void Acquire(const Inputs& in) override {
    phase_ = Phase::kAcquiring;
    op_ = conn_->Start(conn_->store().AcquireLock(kStateId), In(in));
    Pump(in);
  }
  void Release(const Inputs& in) override {
    if (phase_ == Phase::kAcquiring) {
      // The user gave up waiting: the store forgets the acquisition.
      conn_->Abandon(op_, In(in));
      phase_ = Phase::kOver;
      out_.push_back(SimAction{SimAction::Kind::kFailed, {}, 0, absl::CancelledError("cancelled")});
      return;
    }
    if (phase_ != Phase::kHeld) return;
    phase_ = Phase::kReleasing;
    // A lingering release reports at once, with no request.
    op_ = conn_->Start(conn_->store().ReleaseLock(kStateId, lock_id_), In(in));
    Pump(in);
  }
  void OnResponse(const SqlResponse& response, const Inputs& in) override { OnResponseToOp(response, last_op_, in); }
  // The answer to a request of op `op` (RequestOp() when it was sent): an
  // abandoned op's answer is refused by the connection and changes nothing.
  void OnResponseToOp(const SqlResponse& response, uint64_t op, const Inputs& in) override {
    answer_taken_ = conn_->HandleResponse(op, response, In(in)).ok();
    if (!answer_taken_) return;  // an abandoned op's answer
    Pump(in);
  }
  // Whether the connection took the last answer given (an abandoned op's is refused).
  bool AnswerTaken() const { return answer_taken_; }
  const Store& store() const { return conn_->store(); }
  void OnTimer(const Inputs& in) override {
    conn_->HandleTimeout(In(in));
    Pump(in);
  }
  std::optional<SimAction> Poll() override {
    if (out_.empty()) return std::nullopt;
    SimAction a = std::move(out_.front());
    out_.pop_front();
    if (a.kind == SimAction::Kind::kRunSql) {
      last_op_ = sent_.front().first;
      last_lock_id_ = sent_.front().second;
      sent_.pop_front();
    }
    return a;
  }
  uint64_t RequestOp() const override { return last_op_; }
  // The lock a request acts under: this round's acquisition's (a new lock),
  // or, for the store's other ops (release, renewals, a lingering lock's
  // release at a tick), the lock the store holds.
  std::string RequestLockId() const override { return last_lock_id_; }
  bool LeaseValid(int64_t now_ms) const override { return conn_->store().LeaseValid(kStateId, now_ms); }
  int64_t lease_deadline_ms() const override { return conn_->store().LeaseDeadlineMs(kStateId); }
  std::string lock_id() const override { return lock_id_; }
  std::string StateName() const override {
    switch (phase_) {
      case Phase::kIdle: return "store:idle";
      case Phase::kAcquiring: return "store:acquiring";
      case Phase::kHeld: return "store:held";
      case Phase::kReleasing: return "store:releasing";
      case Phase::kOver: return "store:over";
    }
    return "?";
  }
  bool Held() const override { return phase_ == Phase::kHeld; }

 private:
  enum class Phase { kIdle, kAcquiring, kHeld, kReleasing, kOver };

  Inputs In(const Inputs& in) const { return Inputs{in.now_ms, random_}; }

  // The connection's outputs as lock actions.
  void Pump(const Inputs& in) {
    while (std::optional<Transmit> t = conn_->PollTransmit()) {
      const bool acquiring = phase_ == Phase::kAcquiring && t->op == op_;
      sent_.emplace_back(t->op, acquiring || held_id_->empty() ? lock_id_ : *held_id_);
      SimAction a{SimAction::Kind::kRunSql};
      a.request = std::move(t->request);
      out_.push_back(std::move(a));
    }
    while (std::optional<OpEvent> e = conn_->PollEvent()) {
      if (e->renewal) {
        // linger: a lingering lock (not the user's) may be found lost
        // between rounds; the store forgets it and the next round starts afresh.
        if (shared_ && phase_ != Phase::kHeld) continue;
        phase_ = Phase::kOver;
        out_.push_back(SimAction{SimAction::Kind::kLost, {}, 0, e->status});
      } else if (phase_ == Phase::kAcquiring && e->op == op_) {
        phase_ = e->ok ? Phase::kHeld : Phase::kOver;
        if (e->ok) {
          took_back_ = e->result.lock_id != lock_id_;
          lock_id_ = e->result.lock_id;
          *held_id_ = lock_id_;
        }
        out_.push_back(e->ok ? SimAction{SimAction::Kind::kAcquired}
                             : SimAction{SimAction::Kind::kFailed, {}, 0, e->status});
      } else if (phase_ == Phase::kReleasing && e->op == op_) {
        phase_ = Phase::kOver;
        out_.push_back(e->ok ? SimAction{SimAction::Kind::kReleased}
                             : SimAction{SimAction::Kind::kLost, {}, 0, e->status});
      }
    }
    if (std::optional<int64_t> at = conn_->PollTimeout()) {
      out_.push_back(SimAction{SimAction::Kind::kArmTimer, {}, std::max<int64_t>(*at - in.now_ms, 0)});
    }
  }

  std::string random_;
  std::shared_ptr<Connection> conn_;
  bool shared_ = false;
  bool answer_taken_ = false;
  bool took_back_ = false;
  std::string lock_id_;
  Phase phase_ = Phase::kIdle;
  uint64_t op_ = 0;       // the acquisition or release
  // The lock the store holds (lingering or not), shared by the rounds over it.
  std::shared_ptr<std::string> held_id_ = std::make_shared<std::string>();
  // Each request in out_: its op and the lock it acts under (see RequestLockId).
  std::deque<std::pair<uint64_t, std::string>> sent_;
  uint64_t last_op_ = 0;
  std::string last_lock_id_;
  std::deque<SimAction> out_;
};

std::string Short(const std::string& lock_id) { return lock_id.empty() ? "\"\"" : lock_id.substr(0, 6); }

std::string Time(int64_t rel_ms) { return absl::StrFormat("%+.3fs", rel_ms / 1000.0); }

// Trace lines are built only when tracing (a schedule runs in microseconds).
#define TRACE(...)                           \
  do {                                       \
    if (run_.trace) TraceLine(__VA_ARGS__);  \
  } while (0)

class Sim {
 public:
  Sim(const SimConfig& config, uint64_t seed, const RunOptions& run)
      : cfg_(config), run_(run), rng_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {
    result_.config = config.name;
    result_.seed = seed;
  }

  ScheduleResult Run();

 private:
  enum class Ev { kStart, kArrive, kRespond, kResend, kTimer, kHoldEnd, kCancel, kCrash, kMerge, kWrite, kWriteLands,
                  kWriteAnswer, kPrune, kPruneLands };
  struct Event {
    int64_t t;
    uint64_t tie;
    uint64_t order;
    Ev kind;
    int c;        // contender
    uint64_t a;   // request id, timer generation
    int attempt;  // the contender's attempt the event belongs to
  };
  struct Later {
    bool operator()(const Event& x, const Event& y) const {
      if (x.t != y.t) return x.t > y.t;
      if (x.tie != y.tie) return x.tie > y.tie;
      return x.order > y.order;
    }
  };
  struct Request {
    int c = 0;
    int attempt = 0;
    SqlRequest req;
    bool lose_answer = false;  // the client gets a transport failure instead
    int sends = 1;             // of this request, counting resends by the transport policy
    SqlResponse answer;
    std::string lock_id;  // the lock it acts under (SimLock::RequestLockId)
    uint64_t op = 0;      // the op it belongs to (SimLock::RequestOp)
    int64_t ran_at = 0;   // true time it ran on the server
    int host = -1;        // host lists: the index of the host it went to
    bool under_lock = false;  // cluster: an end row sent by the holder (its release)
  };
  // One lock instance on the server: from the moment its CREATE ran there
  // (or, for a lock without a CREATE, its first write landed) until the last
  // of its writes under the lock landed.
  struct Instance {
    int c;
    std::string lock_id;
    int64_t created;
    int64_t last_write;
    std::string last_what;
  };
  struct Contender {
    int index = 0;
    LockOptions options;  // its own settings (they may differ between contenders)
    int64_t offset_ms = 0;
    int64_t rate_ppm = 0;        // its clock's rate error
    int64_t paused_until = 0;    // linger: no input before this true time
    std::shared_ptr<Connection> store;  // linger: kept across rounds
    std::shared_ptr<std::string> store_held_id;
    std::unique_ptr<SimLock> lock;
    int attempt = 0;
    int acquired = 0;
    bool done = false;
    bool crashed = false;
    int64_t inputs = 0;
    int64_t crash_at_input = 0;  // 0: never
    uint64_t timer_gen = 0;
    bool user_holding = false;
    bool cancelled = false;  // the user gave up waiting (Release while acquiring)
    bool round_over = false;  // the lock reported its outcome; the next round is scheduled
    bool just_acquired = false;
    // The user's writes are sequential, as the store's are: the next write,
    // or the release, waits for the answer to the one in flight.
    bool write_in_flight = false;
    bool release_pending = false;
    bool no_renewals = false;         // this hold runs no renewals (as inside one store task)
    bool reported_past_lease = false;  // one such violation per hold is enough
    bool seg_open = false;
    int64_t seg_start = 0;
    int64_t seg_bound = kNever;        // true time the lease runs out (while open)
    int64_t lease_end_true = kNever;   // last known lease end, for the ignore-lease check
    // Cluster: when the claims read whose answer it was given last ran on
    // the server (an acquisition decided on it starts its instance there).
    int64_t last_claims_read_at = 0;
    // Host lists: the simulation's own account of its store's down marks
    // (per host, until when on the contender's clock; 0: none), kept from
    // the answers the store took by the rule in core/endpoints.h, and the
    // hosts the request being sent already went to in this round (a request
    // that failed on one host goes to the next at once).
    std::vector<int64_t> down_until;
    std::vector<int> tried;
    uint64_t tried_op = 0;
    std::string tried_purpose;
    int tried_attempt = 0;
    size_t tried_not_to = 0;
    int64_t next_host_input = -1;  // the input whose answer sends the request on to the next host
    int64_t first_host_send = -1;  // the store's first and last request to any host (its clock)
    int64_t last_host_send = -1;
  };

  // A contender's clock at true time t (its offset, and its rate error
  // accumulated since the schedule began), and back.
  int64_t ClientNow(const Contender& c, int64_t t) const {
    return t + c.offset_ms + (t - t0_) * c.rate_ppm / 1000000;
  }
  int64_t TrueTime(const Contender& c, int64_t now) const {
    // now - offset - t0 = (t - t0) * (1 + ppm/1e6); rounded up, so that the
    // bound is never before the true moment.
    const int64_t scaled = (now - c.offset_ms - t0_) * 1000000;
    const int64_t rate = 1000000 + c.rate_ppm;
    return t0_ + (scaled + rate - 1) / rate;
  }

  // ---- randomness (all from rng_) ----
  uint64_t Next() { return rng_(); }
  int64_t Uniform(int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool Chance(double p) {
    return p > 0 && static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0) < p;
  }
  std::string Bytes(size_t n) {
    std::string s(n, '\0');
    for (char& ch : s) ch = static_cast<char>(Next() & 0xff);
    return s;
  }
  // One direction of the network: mostly quick, sometimes up to D_max. Drawn
  // from the seed alone; the lock's constants play no part.
  int64_t Delay() {
    if (max_delay_ms_ <= 0) return 0;
    int64_t d = Chance(cfg_.quick_delay_prob) ? Uniform(0, max_delay_ms_ / cfg_.quick_delay_divisor)
                                              : Uniform(0, max_delay_ms_);
    result_.longest_delay_ms = std::max(result_.longest_delay_ms, d);
    return d;
  }

  void Push(int64_t t, Ev kind, int c, uint64_t a = 0, int attempt = 0) {
    queue_.push(Event{t, Next(), order_++, kind, c, a, attempt});
  }

  // Call through TRACE so that the arguments are only built when tracing.
  template <typename... Args>
  void TraceLine(int64_t t, const Args&... args) {
    result_.trace.push_back(absl::StrCat("[", Time(t - t0_), "] ", args...));
  }
  template <typename... Args>
  void Violation(int64_t t, const Args&... args) {
    std::string v = absl::StrCat("at ", Time(t - t0_), ": ", args...);
    if (run_.trace) result_.trace.push_back(absl::StrCat("[", Time(t - t0_), "] VIOLATION: ", args...));
    if (result_.violations.size() < kMaxViolations) result_.violations.push_back(std::move(v));
  }
  std::string Name(int c) const { return absl::StrCat("c", c); }
  // The lock's state for the trace ("-" without a lock, or when state names
  // are left out: RunOptions::state_names).
  std::string StateOf(const Contender& c) const {
    return c.lock && run_.state_names ? c.lock->StateName() : std::string("-");
  }
  // ScheduleResult::observed: a request sent, an answer given.
  void ObserveRequest(int64_t t, const Contender& c, const SqlRequest& req) {
    std::string params;
    for (const auto& [k, v] : req.url_params) absl::StrAppend(&params, k, "=", v, ";");
    result_.observed.push_back(absl::StrCat("[", Time(t - t0_), "] ", Name(c.index), " -> ", req.purpose, " attempt ",
                                            req.attempt, req.idempotent ? " idempotent" : "", " send_before ",
                                            req.send_before_ms, " timeout ", req.timeout_ms, " params ", params,
                                            " sql ", req.sql,
                                            req.endpoint.port != 0 ? absl::StrCat(" host ", req.endpoint.host) : ""));
  }
  void ObserveAnswer(int64_t t, const Contender& c, const SqlResponse& r) {
    result_.observed.push_back(absl::StrCat("[", Time(t - t0_), "] ", Name(c.index), " <- ",
                                            r.transport_ok ? "" : "transport failure ", r.transport_error,
                                            r.maybe_delivered ? " (maybe delivered)" : "", " HTTP ", r.http_status,
                                            " code ", r.exception_code_header, " body ", r.body));
  }

  void Setup();
  void Handle(const Event& e);
  // Gives contender `c` an input at true time t, then drains its actions and
  // updates its interval.
  template <typename F>
  void Deliver(Contender& c, int64_t t, const char* what, F input);
  void Drain(Contender& c, int64_t t, int64_t now);
  void Send(Contender& c, int64_t t, SqlRequest req, int sends = 1);
  void EndRound(Contender& c, int64_t t);
  void UpdateInterval(Contender& c, int64_t t, int64_t now);
  void CloseInterval(Contender& c, int64_t end);
  void OnRename(const std::string& from, const std::string& to, const Table& moved, int64_t now);
  void OnClaimOver(const std::string& over, int64_t now);
  // A write under the lock by `lock_id` ran on the server at true time t.
  void Landed(int c, const std::string& lock_id, int64_t t, const std::string& what);
  void CheckExclusion();
  // A mixed fleet: an overlap the Python backend's own race explains.
  bool Excused(const Instance& later, const Instance& earlier);
  void Finish(int64_t end_t);
  std::unique_ptr<SimLock> MakeLock(const Contender& c);
  StoreOptions MakeStoreOptions(const Contender& c) const;
  // The order of the hosts in contender c's list (indices into hosts_).
  std::vector<int> HostOrder(const Contender& c) const;
  // Host lists: a contender starts a new store (its marks start empty); the
  // last one's share of the dead host's budget is counted.
  void NewStore(Contender& c);
  void CloseStore(Contender& c);
  int HostIndex(const Endpoint& e) const;
  bool HostRefused(int host, int64_t t);
  // Checks the host a store sent a request to against the rule, and counts it.
  void CheckHostChoice(Contender& c, int64_t now, int host, const SqlRequest& req, uint64_t op);
  // The store took an answer from `host`: a failure marks it down, else its mark goes.
  void NoteHostAnswer(Contender& c, int host, const SqlRequest& req, const SqlResponse& answer, int64_t now);
  std::string HostSuffix(int host) const { return host < 0 ? std::string() : absl::StrCat(" to ", hosts_[host].host); }
  // Stale window and retry for one contender (or for all of them).
  LockOptions DrawOptions();

  const SimConfig& cfg_;
  const TransportPolicy policy_;  // the production defaults
  RunOptions run_;
  std::mt19937_64 rng_;
  ScheduleResult result_;
  int64_t max_delay_ms_ = 0;
  int64_t t0_ = 0;
  std::optional<Statements> st_;
  std::unique_ptr<SimServer> server_;
  std::vector<Contender> cs_;
  std::vector<Request> requests_;
  // refuse_every_max_ms: the current or next period of refused connections.
  int64_t refuse_from_ms_ = -1;
  int64_t refuse_until_ms_ = 0;
  bool Refused(int64_t t) {
    if (cfg_.refuse_every_max_ms <= 0) return false;
    if (refuse_from_ms_ < 0) {
      refuse_from_ms_ = t + Uniform(0, cfg_.refuse_every_max_ms);
      refuse_until_ms_ = refuse_from_ms_ + Uniform(1, cfg_.refuse_max_ms + 1);
    }
    while (t >= refuse_until_ms_) {
      refuse_from_ms_ = refuse_until_ms_ + Uniform(0, cfg_.refuse_every_max_ms);
      refuse_until_ms_ = refuse_from_ms_ + Uniform(1, cfg_.refuse_max_ms + 1);
    }
    return t >= refuse_from_ms_;
  }
  // Host lists: the stores' hosts, the dead one, and each host's current
  // or next refusal period (host_refuse_every_max_ms).
  std::vector<Endpoint> hosts_;
  int dead_host_ = -1;
  std::vector<std::pair<int64_t, int64_t>> host_refusals_;
  std::vector<Instance> instances_;
  std::map<std::string, std::vector<size_t>> instances_of_;  // lock id -> instances_ indices
  std::vector<std::string> writes_;  // lock id of each user write in flight (Ev::kWriteLands)
  std::vector<SqlRequest> prunes_;   // cluster: each prune in flight (Ev::kPruneLands)
  std::map<std::string, int> owner_;  // lock id -> contender
  std::priority_queue<Event, std::vector<Event>, Later> queue_;
  uint64_t order_ = 0;
};

std::unique_ptr<SimLock> Sim::MakeLock(const Contender& c) {
  if (cfg_.lock == LockKind::kNaive) return std::make_unique<NaiveLock>(*st_, kStateId, c.options, 1000);
  if (cfg_.python != 0 && c.index % 2 == 1) {
    LockOptions python = c.options;
    python.timeout_ms = 30000;  // LOCK_TIMEOUT_SECONDS
    return std::make_unique<PythonBackendLock>(*st_, kStateId, static_cast<PythonLockVersion>(cfg_.python), python,
                                               cfg_.python_pause_prob, cfg_.python_pause_max_ms, rng_());
  }
  if (cfg_.lock == LockKind::kStore && (cfg_.linger || cfg_.keep_store)) {
    Contender& mine = cs_[c.index];
    if (!mine.store) {
      mine.store = std::make_shared<Connection>(*Store::Create(MakeStoreOptions(c)));
      mine.store_held_id = std::make_shared<std::string>();
      NewStore(mine);
    }
    return std::make_unique<StoreLock>(mine.store, mine.store_held_id, Bytes(16));
  }
  if (cfg_.lock == LockKind::kStore) {
    NewStore(cs_[c.index]);
    return std::make_unique<StoreLock>(MakeStoreOptions(c), Bytes(16));
  }
  return std::make_unique<MachineLock>(*st_, c.options, cfg_.defects);
}

StoreOptions Sim::MakeStoreOptions(const Contender& c) const {
  StoreOptions o;
  o.lock = c.options;
  o.linger_locks = cfg_.linger;
  o.python_locks = cfg_.python != 0;
  if (cfg_.cluster) o.cluster.name = "sim";  // as the server's statements (Setup)
  if (!hosts_.empty()) {
    for (int i : HostOrder(c)) o.hosts.push_back(hosts_[i]);
    o.host_down_ms = cfg_.host_down_ms;
  }
  return o;
}

std::vector<int> Sim::HostOrder(const Contender& c) const {
  // With replicas that miss rows, contender i puts host i mod n first (as
  // clients of different sites do), so that claims go in through different
  // replicas; otherwise every store has the list in one order.
  const size_t first = cfg_.replica_fetch_max_ms > 0 ? c.index % hosts_.size() : 0;
  std::vector<int> order;
  for (size_t k = 0; k < hosts_.size(); ++k) order.push_back(static_cast<int>((first + k) % hosts_.size()));
  return order;
}

void Sim::CloseStore(Contender& c) {
  if (c.first_host_send >= 0) {
    result_.dead_host_budget += static_cast<int>(1 + (c.last_host_send - c.first_host_send) / cfg_.host_down_ms);
  }
  c.first_host_send = c.last_host_send = -1;
}

void Sim::NewStore(Contender& c) {
  if (hosts_.empty()) return;
  CloseStore(c);
  c.down_until.assign(hosts_.size(), 0);
  c.tried.clear();
  c.next_host_input = -1;
}

int Sim::HostIndex(const Endpoint& e) const {
  for (size_t i = 0; i < hosts_.size(); ++i) {
    if (hosts_[i] == e) return static_cast<int>(i);
  }
  return -1;
}

bool Sim::HostRefused(int host, int64_t t) {
  if (host == dead_host_) return true;
  if (cfg_.host_refuse_every_max_ms <= 0) return false;
  auto& [from, until] = host_refusals_[host];
  if (from < 0) {
    from = t + Uniform(0, cfg_.host_refuse_every_max_ms);
    until = from + Uniform(1, cfg_.host_refuse_max_ms);
  }
  while (t >= until) {
    from = until + Uniform(0, cfg_.host_refuse_every_max_ms);
    until = from + Uniform(1, cfg_.host_refuse_max_ms);
  }
  return t >= from;
}

void Sim::CheckHostChoice(Contender& c, int64_t now, int host, const SqlRequest& req, uint64_t op) {
  // The same request again on the next host (its answer, in this very
  // input, was a failure to go elsewhere with), or a new one: a new
  // request, or the next round of resends, may go to any host.
  // (A claims read asked again of another replica is a new request: it
  // names one more host that answered it.)
  const bool next_host = c.next_host_input == c.inputs && op == c.tried_op && req.purpose == c.tried_purpose &&
                         req.attempt == c.tried_attempt && req.not_to.size() == c.tried_not_to;
  if (!next_host) {
    c.tried.clear();
    // Hosts that already answered this read (SqlRequest::not_to) count as
    // tried while another host is left (Task::NewRound).
    std::set<int> answered;
    for (const Endpoint& e : req.not_to) {
      if (HostIndex(e) >= 0) answered.insert(HostIndex(e));
    }
    if (answered.size() < hosts_.size()) c.tried.assign(answered.begin(), answered.end());
  }
  // The rule (core/endpoints.h): the first host in the list not yet tried
  // and not marked down; when every such host is marked down, the one whose
  // mark runs out first.
  std::optional<int> want, soonest;
  for (int i : HostOrder(c)) {
    if (std::find(c.tried.begin(), c.tried.end(), i) != c.tried.end()) continue;
    if (c.down_until[i] <= now) {
      want = i;
      break;
    }
    if (!soonest || c.down_until[i] < c.down_until[*soonest]) soonest = i;
  }
  if (!want) want = soonest;
  std::string marks;
  if ((!want || *want != host) && ++result_.host_rule_breaks == 1) {
    // The first one fails the schedule; the rest are only counted, so that
    // the schedule runs on and its counts stay comparable.
    for (size_t i = 0; i < hosts_.size(); ++i) {
      absl::StrAppend(&marks, i ? ", " : "", hosts_[i].host,
                      c.down_until[i] > now ? absl::StrCat(" down for ", c.down_until[i] - now, "ms") : " up",
                      std::find(c.tried.begin(), c.tried.end(), static_cast<int>(i)) != c.tried.end() ? " (tried)" : "");
    }
    Violation(TrueTime(c, now), Name(c.index), " sent ", req.purpose, " (attempt ", req.attempt, ") to ",
              hosts_[host].host, " where the host list's rule picks ",
              want ? hosts_[*want].host : std::string("no host (every one tried)"), ": ", marks,
              " (later sends against the rule are only counted)");
  }
  ++result_.host_sends;
  if (host == dead_host_) {
    ++result_.dead_host_sends;
    if (c.down_until[host] > now) ++result_.dead_host_sends_forced;
  }
  if (c.first_host_send < 0) c.first_host_send = now;
  c.last_host_send = now;
  c.tried.push_back(host);
  c.tried_op = op;
  c.tried_purpose = req.purpose;
  c.tried_attempt = req.attempt;
  c.tried_not_to = req.not_to.size();
}

void Sim::NoteHostAnswer(Contender& c, int host, const SqlRequest& req, const SqlResponse& answer, int64_t now) {
  auto* store = dynamic_cast<StoreLock*>(c.lock.get());
  if (store == nullptr || !store->AnswerTaken()) return;  // an abandoned op's answer changes nothing
  // A failure: no answer, or one of the replica-level codes the simulated
  // server gives (289, a lagging replica; 319, a quorum not confirmed there).
  std::optional<int> code;
  if (answer.transport_ok) code = ClickHouseCode(CheckResponse(answer, ""));
  const bool lagging = code == 289;
  const bool failed = !answer.transport_ok || lagging || code == 319;
  c.down_until[host] = failed ? now + cfg_.host_down_ms : 0;
  // What goes to the next host at once: a request that may be sent again
  // (no answer, and idempotent or never delivered) or met a lagging
  // replica, while the lease it acts under (if any) still runs.
  const bool resendable = !answer.transport_ok && (req.idempotent || !answer.maybe_delivered);
  const bool in_lease = req.send_before_ms <= 0 || now < req.send_before_ms;
  c.next_host_input = (resendable || lagging) && in_lease ? c.inputs : -1;
}

LockOptions Sim::DrawOptions() {
  LockOptions o = cfg_.options;
  o.retry_ms = Uniform(std::min(cfg_.retry_min_ms, cfg_.options.retry_ms), cfg_.options.retry_ms);
  if (cfg_.stale_min_ms > 0) {
    o.stale_ms = Uniform(cfg_.stale_min_ms, cfg_.options.stale_ms);
    if (cfg_.whole_second_stale) o.stale_ms = std::max<int64_t>(1000, o.stale_ms / 1000 * 1000);
  }
  return o;
}

void Sim::Setup() {
  t0_ = kEpochMs + Uniform(0, 999);
  const LockOptions shared = DrawOptions();
  Dialect dialect = Chance(0.5) ? Dialect::kClickHouse18 : Dialect::kModern;
  ClusterOptions cluster;
  if (cfg_.cluster) cluster.name = "sim";
  st_.emplace(*Statements::Create(dialect, "meltano", "state", cluster));

  ServerOptions so;
  so.schema = "meltano";
  so.dialect = dialect;
  so.database_exists = !Chance(cfg_.database_missing_prob);
  so.create_visibility_prob = cfg_.create_visibility_prob;
  so.create_visibility_max_ms = cfg_.create_visibility_max_ms;
  so.insert_visibility_max_ms = cfg_.insert_visibility_max_ms;
  so.missing_table_empty_prob = cfg_.missing_table_empty_prob;
  so.dropped_race_ms = cfg_.dropped_race_ms;
  so.union_now_spread_ms = cfg_.union_now_spread_ms;
  so.quorum_busy_prob = cfg_.quorum_busy_prob;
  so.too_few_replicas_prob = cfg_.too_few_replicas_prob;
  so.quorum_unknown_prob = cfg_.quorum_unknown_prob;
  so.quorum_unknown_max_ms = cfg_.quorum_unknown_max_ms;
  so.lagging_read_prob = cfg_.lagging_read_prob;
  so.lag_every_max_ms = cfg_.lag_every_max_ms;
  so.lag_max_ms = cfg_.lag_max_ms;
  so.prune_lag_max_ms = cfg_.prune_lag_max_ms;
  so.replica_fetch_max_ms = cfg_.replica_fetch_max_ms;
  so.replicas_understated = cfg_.replicas_understated;
  so.old_marker = cfg_.old_marker;
  server_ = std::make_unique<SimServer>(so, &rng_);
  // A mixed fleet: the Python backend's lock table is there (it creates it).
  if (cfg_.python != 0) server_->Execute(st_->CreateLockTable(), t0_);
  server_->on_claim_over = [this](const std::string& over, int64_t now) { OnClaimOver(over, now); };
  server_->on_rename = [this](const std::string& from, const std::string& to, const Table& moved, int64_t now) {
    OnRename(from, to, moved, now);
  };

  if (cfg_.max_hosts > 0) {
    // Host lists: replicas of the one server, one of them dead.
    const int n = static_cast<int>(Uniform(cfg_.min_hosts, cfg_.max_hosts));
    for (int i = 0; i < n; ++i) hosts_.push_back(Endpoint{absl::StrCat("replica-", i), 8123});
    dead_host_ = static_cast<int>(Uniform(0, n - 1));
    host_refusals_.assign(n, {-1, 0});
    result_.hosts = n;
    if (cfg_.replica_fetch_max_ms > 0) server_->SetReplicas(n, dead_host_);
  }
  int k = run_.contenders > 0 ? run_.contenders : static_cast<int>(Uniform(cfg_.min_contenders, cfg_.max_contenders));
  result_.contenders = k;
  cs_.resize(k);
  for (int i = 0; i < k; ++i) {
    Contender& c = cs_[i];
    c.index = i;
    c.options = cfg_.per_contender_settings ? DrawOptions() : shared;
    c.offset_ms = Uniform(-cfg_.max_clock_offset_ms, cfg_.max_clock_offset_ms);
    c.rate_ppm = Uniform(-cfg_.max_clock_rate_ppm, cfg_.max_clock_rate_ppm);
    if (Chance(cfg_.crash_prob)) c.crash_at_input = Uniform(1, 8 * cfg_.rounds);
  }
  // D_max is the configuration's statement about the network, not a
  // fraction of the lock's margin.
  max_delay_ms_ = cfg_.max_delay_ms;
  result_.max_delay_ms = max_delay_ms_;
  TRACE(t0_, "config ", cfg_.name, " seed ", result_.seed, ": ", k, " contenders, ", DialectName(dialect),
        ", max delay ", max_delay_ms_, "ms, database ", so.database_exists ? "exists" : "missing",
        hosts_.empty() ? std::string()
                       : absl::StrCat(", ", hosts_.size(), " hosts (", hosts_[dead_host_].host, " dead)"));
  for (int i = 0; i < k; ++i) {
    Contender& c = cs_[i];
    TRACE(t0_, Name(i), ": stale ", c.options.stale_ms, "ms, retry ", c.options.retry_ms, "ms, margin ",
          LeaseMarginMs(c.options), "ms, clock offset ", c.offset_ms, "ms, rate ", c.rate_ppm, "ppm",
          c.crash_at_input ? absl::StrCat(", will crash after input ", c.crash_at_input) : std::string());
    Push(t0_ + Uniform(0, cfg_.think_max_ms), Ev::kStart, i);
  }
  if (cfg_.merge_every_max_ms > 0) Push(t0_ + Uniform(1, cfg_.merge_every_max_ms), Ev::kMerge, -1);
  if (cfg_.cluster && cfg_.prune_every_max_ms > 0) Push(t0_ + Uniform(1, cfg_.prune_every_max_ms), Ev::kPrune, -1);
}

ScheduleResult Sim::Run() {
  Setup();
  int64_t t = t0_;
  while (!queue_.empty()) {
    Event e = queue_.top();
    queue_.pop();
    t = e.t;
    if (t - t0_ > cfg_.horizon_ms) {
      Violation(t, "the schedule ran past the horizon of ", cfg_.horizon_ms / 1000, "s");
      break;
    }
    if (++result_.events > cfg_.max_events) {
      Violation(t, "the schedule ran past ", cfg_.max_events, " events");
      break;
    }
    Handle(e);
    if (result_.violations.size() >= kMaxViolations) break;  // enough to go on
  }
  Finish(t);
  return std::move(result_);
}

template <typename F>
void Sim::Deliver(Contender& c, int64_t t, const char* what, F input) {
  int64_t now = ClientNow(c, t);
  Inputs in{now, Bytes(16)};
  TRACE(t, Name(c.index), " <- ", what, " (", StateOf(c), ")");
  input(in);
  Drain(c, t, now);
  UpdateInterval(c, t, now);
  if (++c.inputs == c.crash_at_input) Push(t + Uniform(0, 3000), Ev::kCrash, c.index);
}

void Sim::Handle(const Event& e) {
  if (e.c >= 0 && static_cast<size_t>(e.c) < cs_.size() && cs_[e.c].paused_until > e.t) {
    switch (e.kind) {
      case Ev::kStart: case Ev::kRespond: case Ev::kResend: case Ev::kTimer: case Ev::kHoldEnd:
      case Ev::kCancel: case Ev::kWrite: case Ev::kWriteAnswer:
        // The process is paused: this input reaches it when it resumes.
        queue_.push(Event{cs_[e.c].paused_until, e.tie, order_++, e.kind, e.c, e.a, e.attempt});
        return;
      default:
        break;
    }
  }
  switch (e.kind) {
    case Ev::kStart: {
      Contender& c = cs_[e.c];
      if (c.crashed || c.done) return;
      ++c.attempt;
      c.lock = MakeLock(c);
      c.user_holding = false;
      c.cancelled = false;
      c.round_over = false;
      c.write_in_flight = false;
      c.release_pending = false;
      c.no_renewals = false;
      c.reported_past_lease = false;
      c.lease_end_true = kNever;
      Deliver(c, e.t, "acquire", [&](const Inputs& in) { c.lock->Acquire(in); });
      owner_[c.lock->lock_id()] = c.index;
      if (Chance(cfg_.cancel_prob)) {
        Push(e.t + Uniform(0, 2 * c.options.retry_ms), Ev::kCancel, c.index, 0, c.attempt);
      }
      return;
    }
    case Ev::kCancel: {
      // The user stops waiting: Release while the lock is still being
      // acquired. Too late once it holds (it releases after its hold then).
      Contender& c = cs_[e.c];
      if (c.crashed || e.attempt != c.attempt || c.user_holding || c.cancelled || c.round_over) return;
      c.cancelled = true;
      Deliver(c, e.t, "release (cancel)", [&](const Inputs& in) { c.lock->Release(in); });
      return;
    }
    case Ev::kArrive: {
      Request& r = requests_[e.a];
      const size_t unrecognized = server_->unrecognized().size();
      Execution x = server_->Execute(r.req, e.t);
      if (server_->unrecognized().size() > unrecognized) {
        Violation(e.t, "the server did not recognise: ", server_->unrecognized().back());
      }
      r.ran_at = e.t;
      if (r.req.purpose == "renew_claim") {
        // Cluster: a renewal row that was written (not refused: 286/285
        // write nothing) is a write under the lock. A release row is not: it
        // ends only the holder's own claim, so a resend that lands after the
        // next holder took the lock touches nothing of theirs.
        if (CheckResponse(x.response, "").ok() || ClickHouseCode(CheckResponse(x.response, "")) == 319) {
          Landed(r.c, r.lock_id, e.t, r.req.purpose);
        }
      }
      if (cfg_.python != 0) {
        // A mixed fleet: only state writes count (Landed at kWriteLands).
      } else if (r.req.purpose == "create_lock" && CheckResponse(x.response, "").ok()) {
        // A new lock instance exists on the server from now on.
        instances_of_[r.lock_id].push_back(instances_.size());
        instances_.push_back(Instance{r.c, r.lock_id, e.t, e.t, "its CREATE"});
      } else if (r.req.purpose == "renew_lock" || r.req.purpose == "drop_lock") {
        Landed(r.c, r.lock_id, e.t, r.req.purpose);
      }
      TRACE(e.t, "server <- ", Name(r.c), " ", r.req.purpose, ": ", x.summary,
            r.lose_answer ? " (answer will be lost)" : "");
      // The answer leaves when the statement is done (a CREATE waits for its
      // row) and travels back; a lost one becomes the transport failure.
      if (!r.lose_answer) r.answer = std::move(x.response);
      Push(x.done_ms + Delay(), Ev::kRespond, r.c, e.a, r.attempt);
      return;
    }
    case Ev::kRespond: {
      Request& r = requests_[e.a];
      Contender& c = cs_[r.c];
      if (c.crashed) return;
      // linger: the rounds share one store, so every answer is its.
      if (r.attempt != c.attempt && !cfg_.linger && !cfg_.keep_store) {
        TRACE(e.t, Name(c.index), ": answer to an earlier attempt's ", r.req.purpose, " dropped");
        return;
      }
      std::string what;
      if (run_.trace) {
        what = r.answer.transport_ok ? absl::StrCat(r.req.purpose, " answer HTTP ", r.answer.http_status)
                                     : absl::StrCat(r.req.purpose, " transport failure");
      }
      if (cfg_.lock == LockKind::kMachine && MayResend(r.req, r.answer) && r.sends < policy_.attempts) {
        // The transport policy (core/task.h) resends it below the machine,
        // as every host's Task does: the machine never sees this failure.
        TRACE(e.t, Name(c.index), ": ", r.req.purpose, " transport failure; resent by the policy");
        Push(e.t + (policy_.backoff_ms << (r.sends - 1)), Ev::kResend, r.c, e.a, r.attempt);
        return;
      }
      if (r.req.purpose == "inspect_claims") c.last_claims_read_at = r.ran_at;
      // Deliver may add requests (and move requests_): copy the answer first.
      const SqlResponse answer = r.answer;
      const uint64_t op = r.op;
      const int host = r.host;
      std::optional<SqlRequest> sent;
      if (host >= 0) sent = r.req;
      if (run_.trace) ObserveAnswer(e.t, c, answer);
      Deliver(c, e.t, what.c_str(), [&](const Inputs& in) {
        c.lock->OnResponseToOp(answer, op, in);
        if (host >= 0) NoteHostAnswer(c, host, *sent, answer, in.now_ms);
      });
      return;
    }
    case Ev::kResend: {
      Contender& c = cs_[e.c];
      if (c.crashed || e.attempt != c.attempt) return;
      // Send may move requests_: copy what it needs first.
      SqlRequest again = requests_[e.a].req;
      const int sends = requests_[e.a].sends + 1;
      ++again.attempt;
      Send(c, e.t, std::move(again), sends);
      return;
    }
    case Ev::kTimer: {
      Contender& c = cs_[e.c];
      if (c.crashed || e.attempt != c.attempt || e.a != c.timer_gen) return;
      Deliver(c, e.t, "timer", [&](const Inputs& in) { c.lock->OnTimer(in); });
      return;
    }
    case Ev::kHoldEnd: {
      Contender& c = cs_[e.c];
      if (c.crashed || e.attempt != c.attempt || !c.user_holding) return;
      if (c.write_in_flight) {
        c.release_pending = true;  // released once the write's answer is back
        return;
      }
      c.user_holding = false;
      Deliver(c, e.t, "release", [&](const Inputs& in) { c.lock->Release(in); });
      return;
    }
    case Ev::kCrash: {
      Contender& c = cs_[e.c];
      if (c.crashed || c.done) return;
      c.crashed = true;
      ++result_.crashed;
      TRACE(e.t, Name(c.index), " CRASHES (", StateOf(c), ")");
      if (c.seg_open) CloseInterval(c, std::min(e.t, c.seg_bound));
      return;
    }
    case Ev::kWrite: {
      // The user writes state under the lock: only while the lease is valid
      // (the store's LeaseCheck), unless it ignores its lease.
      Contender& c = cs_[e.c];
      if (c.crashed || e.attempt != c.attempt || !c.user_holding || c.write_in_flight || c.release_pending) return;
      const int64_t now = ClientNow(c, e.t);
      if (cfg_.ignore_lease || c.lock->LeaseValid(now)) {
        if (e.t > c.lease_end_true && !c.reported_past_lease) {
          c.reported_past_lease = true;
          Violation(e.t, Name(c.index), " acted under the lock ", e.t - c.lease_end_true,
                    "ms after its lease ran out (at ", Time(c.lease_end_true - t0_), ")");
        }
        ++result_.writes_sent;
        c.write_in_flight = true;
        // Like any request: it may never arrive, or run with its answer lost.
        const int64_t there = Delay();
        const bool arrives = !Chance(cfg_.lost_prob) || Chance(0.5);
        TRACE(e.t, Name(c.index), " -> state write", arrives ? "" : " (never arrives)");
        if (arrives) {
          writes_.push_back(c.lock->lock_id());
          Push(e.t + there, Ev::kWriteLands, c.index, writes_.size() - 1, c.attempt);
        }
        Push(e.t + there + Delay(), Ev::kWriteAnswer, c.index, 0, c.attempt);
        return;
      }
      TRACE(e.t, Name(c.index), " state write not sent: the lease ran out");
      Push(e.t + Uniform(1, cfg_.write_every_max_ms), Ev::kWrite, c.index, 0, c.attempt);
      return;
    }
    case Ev::kWriteAnswer: {
      Contender& c = cs_[e.c];
      if (c.crashed || e.attempt != c.attempt) return;
      c.write_in_flight = false;
      if (!c.user_holding) return;  // the lock ended meanwhile
      if (c.release_pending) {
        c.release_pending = false;
        c.user_holding = false;
        Deliver(c, e.t, "release", [&](const Inputs& in) { c.lock->Release(in); });
        return;
      }
      Push(e.t + Uniform(1, cfg_.write_every_max_ms), Ev::kWrite, c.index, 0, c.attempt);
      return;
    }
    case Ev::kWriteLands: {
      // In flight: it lands even if its sender has crashed or moved on since.
      Landed(e.c, writes_[e.a], e.t, "a state write");
      return;
    }
    case Ev::kPrune: {
      // The pruner's claims read runs now; its prune lands a round trip later.
      bool active = std::any_of(cs_.begin(), cs_.end(), [](const Contender& c) { return !c.done && !c.crashed; });
      if (!active) return;
      Push(e.t + Uniform(1, cfg_.prune_every_max_ms), Ev::kPrune, -1);
      Execution read = server_->Execute(st_->InspectClaims(kStateId), e.t);
      if (!CheckResponse(read.response, "").ok()) return;  // no table yet, or a lagging replica
      std::vector<std::string> ids;
      if (cfg_.prune_live_claims) {
        absl::StatusOr<Rows> rows = ParseTabSeparated(read.response.body, 7);
        for (const chstate::Row& row : rows.value_or(Rows{})) ids.push_back(row[0].value_or(""));
      } else {
        absl::StatusOr<LockInspection> insp = ParseClaimInspection(read.response.body, "", 0);
        if (!insp.ok()) {
          Violation(e.t, "the pruner could not read the claims: ", insp.status().ToString());
          return;
        }
        ids = insp->dead;
      }
      if (ids.empty()) return;
      prunes_.push_back(st_->PruneClaims(kStateId, ids));
      TRACE(e.t, "pruner reads ", ids.size(), " prunable claims");
      Push(e.t + Delay() + Delay(), Ev::kPruneLands, -1, prunes_.size() - 1);
      return;
    }
    case Ev::kPruneLands: {
      const size_t unrecognized = server_->unrecognized().size();
      Execution x = server_->Execute(prunes_[e.a], e.t);
      if (server_->unrecognized().size() > unrecognized) {
        Violation(e.t, "the server did not recognise: ", server_->unrecognized().back());
      }
      ++result_.prunes;
      TRACE(e.t, "server <- pruner: ", x.summary);
      return;
    }
    case Ev::kMerge: {
      server_->Merge(e.t);
      bool active = std::any_of(cs_.begin(), cs_.end(), [](const Contender& c) { return !c.done && !c.crashed; });
      if (active) Push(e.t + Uniform(1, cfg_.merge_every_max_ms), Ev::kMerge, -1);
      return;
    }
  }
}

void Sim::Drain(Contender& c, int64_t t, int64_t now) {
  while (std::optional<SimAction> a = c.lock->Poll()) {
    switch (a->kind) {
      case SimAction::Kind::kRunSql: {
        const std::string& purpose = a->request.purpose;
        // Acts under the lock go out only while the lease is valid.
        const bool release_row = purpose == "end_claim" && c.lock->StateName() == "dropping";
        // A mixed fleet: a store that yields to a Python holder drops the
        // lock it is still acquiring, under the lease of that acquisition's
        // machine (the store reports only the lease of a lock it holds).
        const bool yielding = cfg_.python != 0 && c.lock->StateName() == "store:acquiring";
        if ((purpose == "drop_lock" || purpose == "renew_lock" || purpose == "renew_claim" || release_row) &&
            !yielding && now >= c.lock->lease_deadline_ms()) {
          Violation(t, Name(c.index), " sent ", purpose, " ", now - c.lock->lease_deadline_ms(),
                    "ms after its lease deadline");
        }
        if (purpose == "renew_lock" || purpose == "renew_claim") ++result_.renewals;
        if (purpose == "claim_lock") owner_[c.lock->lock_id()] = c.index;
        Send(c, t, std::move(a->request));
        break;
      }
      case SimAction::Kind::kArmTimer: {
        ++c.timer_gen;  // replaces any earlier timer
        if (a->delay_ms < 0) Violation(t, Name(c.index), " armed a timer with a negative delay");
        if ((cfg_.ignore_lease || c.no_renewals) && c.lock->Held()) {
          TRACE(t, Name(c.index), " -> timer ", a->delay_ms, "ms (withheld: renewals are not run)");
          break;
        }
        TRACE(t, Name(c.index), " -> timer ", a->delay_ms, "ms");
        Push(t + std::max<int64_t>(a->delay_ms, 0), Ev::kTimer, c.index, c.timer_gen, c.attempt);
        break;
      }
      case SimAction::Kind::kAcquired: {
        ++result_.acquisitions;
        if (c.cancelled) {
          // Acquired after the user gave up: the machine releases it by
          // itself, and the user does not act under it.
          TRACE(t, Name(c.index), " acquired after cancelling (", StateOf(c), ")");
          break;
        }
        ++c.acquired;
        c.user_holding = true;
        if (cfg_.cluster) {
          // The lock instance exists from the claims read it was decided on.
          instances_of_[c.lock->lock_id()].push_back(instances_.size());
          instances_.push_back(Instance{c.index, c.lock->lock_id(), c.last_claims_read_at, c.last_claims_read_at,
                                        "its winning read"});
        }
        if (auto* store = dynamic_cast<StoreLock*>(c.lock.get()); store != nullptr) {
          // A claim's id is not the acquisition's (cluster mode): only a
          // lingering lock is taken back.
          if (cfg_.linger && store->TookBack()) ++result_.taken_back;
          owner_[c.lock->lock_id()] = c.index;
        }
        c.no_renewals = Chance(cfg_.withhold_renewals_prob);
        c.just_acquired = true;
        bool valid = c.lock->LeaseValid(now);
        if (!valid) ++result_.expired_on_acquire;
        const int64_t stale = c.options.stale_ms;
        int64_t hold = cfg_.ignore_lease         ? 3 * stale
                       : Chance(cfg_.long_hold_prob) ? Uniform(stale, 3 * stale)
                                                     : Uniform(0, cfg_.short_hold_max_ms);
        TRACE(t, Name(c.index), " ACQUIRED as ", Short(c.lock->lock_id()), " (acquisition ", c.acquired, "), lease ",
              valid ? absl::StrCat("until ", Time(TrueTime(c, c.lock->lease_deadline_ms()) - t0_))
                    : std::string("ALREADY RUN OUT"),
              ", holding ", hold, "ms");
        Push(t + hold, Ev::kHoldEnd, c.index, 0, c.attempt);
        Push(t + Uniform(0, cfg_.write_every_max_ms), Ev::kWrite, c.index, 0, c.attempt);
        break;
      }
      case SimAction::Kind::kReleased:
        ++result_.releases;
        TRACE(t, Name(c.index), " RELEASED");
        EndRound(c, t);
        break;
      case SimAction::Kind::kFailed:
      case SimAction::Kind::kLost: {
        bool lost = a->kind == SimAction::Kind::kLost;
        ++(lost ? result_.losses : result_.failures);
        TRACE(t, Name(c.index), lost ? " LOST: " : " FAILED: ", a->status.ToString());
        if (absl::StrContains(a->status.message(), "misuse")) {
          Violation(t, Name(c.index), " reported misuse (a host-driving bug or a missing transition): ",
                    a->status.ToString());
        }
        if (cfg_.expect_no_failures) {
          Violation(t, Name(c.index), lost ? " lost the lock" : " failed to acquire", " without any fault: ",
                    a->status.ToString());
        }
        EndRound(c, t);
        break;
      }
    }
  }
}

void Sim::Send(Contender& c, int64_t t, SqlRequest req, int sends) {
  uint64_t id = requests_.size();
  Request r;
  r.sends = sends;
  r.c = c.index;
  r.attempt = c.attempt;
  r.lock_id = c.lock->RequestLockId();
  r.op = c.lock->RequestOp();
  r.under_lock = req.purpose == "end_claim" && c.lock->StateName() == "dropping";
  if (!hosts_.empty()) {
    r.host = HostIndex(req.endpoint);
    if (r.host < 0) {
      Violation(t, Name(c.index), " sent ", req.purpose, " to ", req.endpoint.host, ":", req.endpoint.port,
                ", not a host of its list");
    } else {
      CheckHostChoice(c, ClientNow(c, t), r.host, req, r.op);
    }
  }
  if (run_.trace) ObserveRequest(t, c, req);
  int64_t there = Delay();
  if (req.purpose == "renew_lock" && Chance(cfg_.slow_renewal_prob)) {
    // Beyond D_max on purpose (a stalled lock-table insert).
    there = Uniform(cfg_.slow_renewal_min_ms, cfg_.slow_renewal_max_ms);
    TRACE(t, Name(c.index), " (this renewal is slow: it lands after ", there, "ms)");
  }
  if (r.host >= 0 ? HostRefused(r.host, t) : Refused(t)) {
    r.answer.transport_ok = false;
    r.answer.maybe_delivered = false;
    r.answer.transport_error = r.host < 0 ? "connection refused (simulated: the server refuses connections for a while)"
                               : r.host == dead_host_
                                   ? absl::StrCat("connection refused (simulated: ", hosts_[r.host].host, " is dead)")
                                   : absl::StrCat("connection refused (simulated: ", hosts_[r.host].host,
                                                  " refuses connections for a while)");
    r.lose_answer = true;
    if (r.host >= 0 && r.host != dead_host_) ++result_.host_refusals;
    TRACE(t, Name(c.index), " -> ", req.purpose, HostSuffix(r.host), " (refused)");
    r.req = std::move(req);
    requests_.push_back(std::move(r));
    Push(t + Delay(), Ev::kRespond, c.index, id, c.attempt);
    return;
  }
  bool lost = Chance(cfg_.lost_prob);
  bool arrives = !lost || Chance(0.5);
  r.lose_answer = lost;
  if (lost) {
    r.answer.transport_ok = false;
    r.answer.maybe_delivered = true;
    r.answer.transport_error = "connection reset by peer (simulated)";
  }
  TRACE(t, Name(c.index), " -> ", req.purpose, HostSuffix(r.host),
        lost ? (arrives ? " (runs; answer lost)" : " (never arrives)") : "");
  r.req = std::move(req);
  requests_.push_back(std::move(r));
  if (arrives) {
    Push(t + there, Ev::kArrive, c.index, id, c.attempt);
  } else {
    Push(t + there + Delay(), Ev::kRespond, c.index, id, c.attempt);
  }
}

void Sim::EndRound(Contender& c, int64_t t) {
  c.user_holding = false;
  c.round_over = true;
  if (c.acquired >= cfg_.rounds) {
    c.done = true;
    TRACE(t, Name(c.index), " done");
    return;
  }
  if (cfg_.linger && Chance(cfg_.pause_prob)) {
    // Paused between messages, holding a lingering lock: its timers and
    // answers wait, and its lease may run out meanwhile.
    c.paused_until = t + Uniform(1, cfg_.pause_max_ms);
    ++result_.pauses;
    TRACE(t, Name(c.index), " PAUSED until ", Time(c.paused_until - t0_));
  }
  Push(t + Uniform(0, cfg_.think_max_ms), Ev::kStart, c.index);
}

void Sim::UpdateInterval(Contender& c, int64_t t, int64_t now) {
  const bool valid = c.lock->LeaseValid(now);
  if (c.seg_open && !cfg_.ignore_lease && t >= c.seg_bound) {
    // The lease ran out before this input; the interval ended then.
    CloseInterval(c, c.seg_bound);
  }
  const bool may_act = c.user_holding && (cfg_.ignore_lease || valid);
  if (c.seg_open && !may_act) CloseInterval(c, t);
  if (!c.seg_open && may_act) {
    c.seg_open = true;
    c.seg_start = t;
    if (!c.just_acquired) {
      ++result_.revivals;
      TRACE(t, Name(c.index), " lease valid again after it ran out");
    }
  }
  c.just_acquired = false;
  if (valid) {
    const int64_t deadline = c.lock->lease_deadline_ms();
    // LeaseValid must mean exactly "now < lease_deadline_ms()" while held, or
    // the interval bound computed here would be wrong.
    if (!c.lock->LeaseValid(deadline - 1) || c.lock->LeaseValid(deadline)) {
      Violation(t, Name(c.index), " LeaseValid does not switch off at lease_deadline_ms()");
    }
    c.lease_end_true = TrueTime(c, deadline);
  }
  if (c.seg_open) c.seg_bound = cfg_.ignore_lease ? kNever : c.lease_end_true;
}

void Sim::CloseInterval(Contender& c, int64_t end) {
  c.seg_open = false;
  if (end > c.seg_start) {
    TRACE(end, Name(c.index), " stops acting under the lock (held since ", Time(c.seg_start - t0_), ")");
  }
}

void Sim::OnRename(const std::string& from, const std::string& to, const Table& moved, int64_t now) {
  if (!absl::StrContains(to, "_dead_")) {
    Violation(now, "unexpected RENAME ", from, " TO ", to);
    return;
  }
  ++result_.takeovers;
  // The holder is the creation row's lock id; its newest row, visible or
  // not, is what a stale judgement must be older than.
  std::string holder;
  int64_t newest = moved.created_ms;
  for (const Row& r : moved.rows) {
    if (r.seq == 0) holder = r.lock_id;
  }
  for (const Row& r : moved.rows) {
    if (r.lock_id == holder) newest = std::max(newest, r.stamped_ms);
  }
  // The holder's own stale window: its lease is computed from it.
  auto owner = owner_.find(holder);
  int64_t stale_ms = 0;
  for (const Contender& c : cs_) stale_ms = std::max(stale_ms, c.options.stale_ms);
  if (owner != owner_.end()) stale_ms = cs_[owner->second].options.stale_ms;
  auto who = [&] {
    return owner == owner_.end() ? absl::StrCat("lock id ", Short(holder))
                                 : absl::StrCat(Name(owner->second), "'s lock ", Short(holder),
                                                cs_[owner->second].crashed ? " (holder crashed)" : " (holder alive)");
  };
  TRACE(now, "TAKEOVER of ", who(), ", newest row ", now - newest, "ms old");
  if (now - newest <= stale_ms) {
    Violation(now, "took over ", who(), " only ", now - newest, "ms after its newest row (its stale window ",
              stale_ms, "ms)");
  }
}

void Sim::OnClaimOver(const std::string& over, int64_t now) {
  // Cluster: a claim takes over the claims it names. Each must be stale by
  // the server's (true) clock: its newest confirmed row older than its
  // holder's window. (A row whose quorum is unconfirmed, 319, and not yet
  // visible extends no lease: the holder counts only confirmed renewals.)
  ++result_.takeovers;
  for (absl::string_view id : absl::StrSplit(over, ',', absl::SkipEmpty())) {
    int64_t newest = -1;
    bool ended = false;
    for (const ClaimRow& r : server_->claims()) {
      if (r.lock_id == id && r.visible_ms <= now) newest = std::max(newest, r.stamped_ms);
      // Its holder released it (or, never holding, withdrew): a pruner may
      // have removed the end row before the claim's other rows, and a taker
      // then names it; no holder is left to overlap with.
      if (r.lock_id == id && r.seq == 3 && r.stamped_ms <= now) ended = true;
    }
    if (ended) continue;
    auto owner = owner_.find(std::string(id));
    int64_t stale_ms = 0;
    for (const Contender& c : cs_) stale_ms = std::max(stale_ms, c.options.stale_ms);
    if (owner != owner_.end()) stale_ms = cs_[owner->second].options.stale_ms;
    TRACE(now, "TAKEOVER (claim) of ", Short(std::string(id)), ", newest row ", now - newest, "ms old");
    if (newest >= 0 && now - newest <= stale_ms) {
      Violation(now, "a claim took over lock id ", Short(std::string(id)), " only ", now - newest,
                "ms after its newest row (its stale window ", stale_ms, "ms)");
    }
  }
}

void Sim::Landed(int c, const std::string& lock_id, int64_t t, const std::string& what) {
  ++result_.writes_landed;
  TRACE(t, "server <- ", Name(c), " ", what, " under lock ", Short(lock_id), " lands");
  // It belongs to the newest instance of its lock id created before it landed.
  auto it = instances_of_.find(lock_id);
  if (it != instances_of_.end()) {
    for (auto i = it->second.rbegin(); i != it->second.rend(); ++i) {
      Instance& inst = instances_[*i];
      if (inst.created <= t) {
        if (t >= inst.last_write) {
          inst.last_write = t;
          inst.last_what = what;
        }
        return;
      }
    }
  }
  // No CREATE of its own ran before it (the naive lock has none): the
  // instance starts with this write.
  instances_of_[lock_id].push_back(instances_.size());
  instances_.push_back(Instance{c, lock_id, t, t, what});
}

bool Sim::Excused(const Instance& later, const Instance& earlier) {
  if (cfg_.python == 0) return false;
  const bool later_python = later.c % 2 == 1, earlier_python = earlier.c % 2 == 1;
  if (later_python && earlier_python) {
    ++result_.python_overlaps;
    return true;
  }
  const Instance& python = later_python ? later : earlier;
  const Instance& chstate = later_python ? earlier : later;
  if (!later_python && !earlier_python) return false;
  // The Python holder's row was gone before chstate's hold began, merged
  // away in favour of another Python row (not a marker of chstate's).
  auto it = server_->merged_away().find(python.lock_id);
  if (it == server_->merged_away().end() || it->second.at_ms > chstate.created) return false;
  if (absl::StartsWith(it->second.survivor, "!chstate:") || absl::StartsWith(it->second.survivor, "chstate:")) {
    // chstate's own marker merged the holder's row away: the known gap of
    // docs/lock.md (a yield after the marker, with a merge within that
    // round trip). Counted apart, and the test bounds it; the old marker's
    // overlaps are never of this kind only.
    if (cfg_.old_marker) return false;
    ++result_.marker_merge_overlaps;
    TRACE(later.created, "overlap of ", Name(later.c), " and ", Name(earlier.c), ": ", Name(python.c), "'s row ",
          Short(python.lock_id), " was merged into chstate's marker ", Short(it->second.survivor), " at ",
          Time(it->second.at_ms - t0_), " (the known gap)");
    return true;
  }
  ++result_.orphan_overlaps;
  TRACE(later.created, "overlap of ", Name(later.c), " and ", Name(earlier.c), " not blamed on chstate: ",
        Name(python.c), "'s row ", Short(python.lock_id), " was merged into ", Short(it->second.survivor), " at ",
        Time(it->second.at_ms - t0_));
  return true;
}

void Sim::CheckExclusion() {
  // Instances ordered by the moment they came to exist on the server; each
  // must be over (its last write landed) before the next one exists.
  std::vector<const Instance*> order;
  for (const Instance& i : instances_) order.push_back(&i);
  std::stable_sort(order.begin(), order.end(),
                   [](const Instance* a, const Instance* b) { return a->created < b->created; });
  const Instance* reach = nullptr;  // the instance whose last write landed latest so far
  for (const Instance* s : order) {
    if (reach && s->created < reach->last_write && s->lock_id != reach->lock_id && !Excused(*s, *reach)) {
      ++result_.overlaps;
      if (reach->last_what == "renew_lock") ++result_.renewal_row_overlaps;
      Violation(s->created, "OVERLAP: ", Name(s->c), "'s lock ", Short(s->lock_id), " exists on the server from ",
                Time(s->created - t0_), ", but ", reach->last_what, " of ", Name(reach->c), "'s lock ",
                Short(reach->lock_id), " (since ", Time(reach->created - t0_), ") landed at ",
                Time(reach->last_write - t0_), ", ", reach->last_write - s->created, "ms later");
    }
    if (!reach || s->last_write > reach->last_write) reach = s;
  }
}

void Sim::Finish(int64_t end_t) {
  result_.end_ms = end_t - t0_;
  for (Contender& c : cs_) {
    if (c.seg_open) CloseInterval(c, std::min(end_t, c.seg_bound));
    CloseStore(c);
  }
  CheckExclusion();
  if (cfg_.expect_no_failures && result_.takeovers > 0) {
    Violation(end_t, result_.takeovers, " stale takeover(s) without any fault");
  }
  if (cfg_.check_progress) {
    for (const Contender& c : cs_) {
      if (!c.crashed && c.acquired < cfg_.rounds) {
        Violation(end_t, "no progress: ", Name(c.index), " acquired ", c.acquired, " of ", cfg_.rounds,
                  " times (state ", StateOf(c), ")");
      }
    }
  }
}

}  // namespace

ScheduleResult RunSchedule(const SimConfig& config, uint64_t seed, const RunOptions& run) {
  return Sim(config, seed, run).Run();
}

std::string ScheduleResult::Report() const {
  std::string out = absl::StrCat("config ", config, " seed ", seed, ": ", contenders, " contenders, ", events,
                                 " events, ", end_ms / 1000.0, "s simulated, ", acquisitions, " acquisitions, ",
                                 releases, " releases, ", failures, " failures, ", losses, " losses, ", takeovers,
                                 " takeovers, ", renewals, " renewals, ", revivals, " revivals, ", crashed,
                                 " crashed, ", taken_back, " taken back, ", pauses, " pauses, ", writes_landed,
                                 " writes landed, ", python_overlaps, " Python-Python overlaps, ", orphan_overlaps,
                                 " overlaps with a Python holder left without a row, ", marker_merge_overlaps,
                                 " with a Python holder whose row chstate's marker merged away, D_max ", max_delay_ms,
                                 "ms (longest drawn ", longest_delay_ms, "ms)\n");
  if (hosts > 0) {
    absl::StrAppend(&out, "  ", hosts, " hosts: ", host_sends, " requests to hosts, ", host_refusals,
                    " refused by a live host, ", dead_host_sends, " to the dead host (", dead_host_sends_forced,
                    " while marked down; budget ", dead_host_budget, "), ", host_rule_breaks,
                    " against the host list's rule\n");
  }
  for (const std::string& v : violations) absl::StrAppend(&out, "  VIOLATION ", v, "\n");
  if (!trace.empty()) {
    absl::StrAppend(&out, "  trace:\n");
    for (const std::string& l : trace) absl::StrAppend(&out, "    ", l, "\n");
  }
  return out;
}

namespace {

// The replicas' faults every cluster configuration adds (see below).
void AddReplicaFaults(SimConfig& c) {
  c.quorum_busy_prob = 0.1;
  c.too_few_replicas_prob = 0.02;
  c.quorum_unknown_prob = 0.05;
  c.quorum_unknown_max_ms = 3000;
  c.lagging_read_prob = 0.05;
}

// The configuration named `name` among `configs` (made earlier), to derive another from.
SimConfig Named(const std::vector<SimConfig>& configs, const std::string& name) {
  for (const SimConfig& c : configs) {
    if (c.name == name) return c;
  }
  std::abort();  // a configuration derived from one that does not exist: a bug in this list
}

}  // namespace

std::vector<SimConfig> Configs() {
  std::vector<SimConfig> out;
  SimConfig base;
  // D_max (one-way) per configuration, in ms. The stated assumption: below
  // the lease margin of every contender (a tenth of its stale window, at
  // least 100 ms), e.g. < 500 ms at the default 5 s here.
  base.max_delay_ms = 50;

  {  // A reliable network and server: no failure, loss or takeover is acceptable.
    SimConfig c = base;
    c.name = "no-faults";
    c.min_contenders = 2;
    c.max_contenders = 4;
    c.rounds = 3;
    c.expect_no_failures = true;
    out.push_back(c);
  }
  {  // Requests delayed up to 400 ms (80% of the 500 ms margin); 5% of answers lost; code 218
     // right after a DROP; the inspection's UNION straddling a second.
    SimConfig c = base;
    c.name = "delays-and-losses";
    c.max_delay_ms = 400;  // D_max < 500 ms margin
    c.lost_prob = 0.05;
    c.missing_table_empty_prob = 0.3;
    c.database_missing_prob = 0.2;
    c.dropped_race_ms = 300;
    c.union_now_spread_ms = 500;
    out.push_back(c);
  }
  {  // Creation rows visible up to 2 s after their table exists; some answers lost.
    SimConfig c = base;
    c.name = "visibility";
    c.max_delay_ms = 250;  // D_max < 500 ms margin
    c.lost_prob = 0.03;
    c.create_visibility_prob = 0.5;
    c.create_visibility_max_ms = 2000;
    out.push_back(c);
  }
  {  // Contenders die at random moments; survivors must take over.
    SimConfig c = base;
    c.name = "crashes";
    c.max_delay_ms = 250;  // D_max < 500 ms margin
    c.crash_prob = 0.3;
    c.max_contenders = 4;
    out.push_back(c);
  }
  {  // Late creation rows, lost answers and renewals together: a CREATE whose
     // answer is lost and whose row is not yet visible must still count its
     // lease from the CREATE that made the table.
    SimConfig c = base;
    c.name = "visibility-renewals";
    c.max_delay_ms = 250;  // D_max < 500 ms margin
    c.create_visibility_prob = 0.7;
    c.create_visibility_max_ms = 3000;
    c.lost_prob = 0.1;
    c.long_hold_prob = 0.5;
    out.push_back(c);
  }
  {  // Users who give up waiting: Release while still acquiring.
    SimConfig c = base;
    c.name = "cancels";
    c.max_delay_ms = 250;  // D_max < 500 ms margin
    c.cancel_prob = 0.4;
    c.lost_prob = 0.05;
    c.create_visibility_prob = 0.3;
    c.create_visibility_max_ms = 1000;
    c.max_contenders = 4;
    out.push_back(c);
  }
  {  // Client clocks up to an hour apart (same rate).
    SimConfig c = base;
    c.name = "clock-offsets";
    c.max_delay_ms = 250;  // D_max < 500 ms margin
    c.max_clock_offset_ms = 3600 * 1000;
    out.push_back(c);
  }
  {  // Holds past the stale window: renewals must keep the lease, and some are lost.
    SimConfig c = base;
    c.name = "long-holds";
    c.max_delay_ms = 400;  // D_max < 500 ms margin
    c.long_hold_prob = 0.4;
    c.lost_prob = 0.05;
    out.push_back(c);
  }
  {  // Up to 8 contenders.
    SimConfig c = base;
    c.name = "many-contenders";
    c.min_contenders = 5;
    c.max_contenders = 8;
    c.max_delay_ms = 250;  // D_max < 500 ms margin
    out.push_back(c);
  }
  {  // All faults at once.
    SimConfig c = base;
    c.name = "everything";
    c.max_contenders = 5;
    c.max_delay_ms = 160;  // D_max < 200 ms, the smallest margin (2 s window)
    c.lost_prob = 0.05;
    c.create_visibility_prob = 0.3;
    c.create_visibility_max_ms = 2000;
    c.missing_table_empty_prob = 0.3;
    c.database_missing_prob = 0.1;
    c.dropped_race_ms = 300;
    c.union_now_spread_ms = 500;
    c.crash_prob = 0.2;
    c.max_clock_offset_ms = 3600 * 1000;
    c.long_hold_prob = 0.2;
    c.per_contender_settings = true;
    c.stale_min_ms = 2000;
    c.options.stale_ms = 8000;
    c.cancel_prob = 0.1;
    out.push_back(c);
  }
  {  // Contenders with different stale windows (2 to 12 s) and retries.
    SimConfig c = base;
    c.name = "mixed-settings";
    c.per_contender_settings = true;
    c.stale_min_ms = 2000;
    c.options.stale_ms = 12000;
    c.whole_second_stale = true;
    c.max_delay_ms = 160;  // D_max < 200 ms, the smallest margin (2 s window)
    c.lost_prob = 0.02;
    c.crash_prob = 0.2;
    c.long_hold_prob = 0.3;
    out.push_back(c);
  }
  {  // A stale window that is not whole seconds (1 to 10 s, any ms).
    SimConfig c = base;
    c.name = "odd-stale";
    c.stale_min_ms = 1000;
    c.options.stale_ms = 9999;
    c.max_delay_ms = 80;  // D_max < 100 ms, the smallest margin
    c.lost_prob = 0.02;
    c.crash_prob = 0.2;
    c.long_hold_prob = 0.3;
    out.push_back(c);
  }
  {  // The floor of the stale window (kMinStaleLockMs, 1 s: Meltano's
     // lock_timeout_seconds at its smallest): renewals every 333 ms, a 100 ms
     // margin, long holds, lost answers and crashes, delays below the margin.
    SimConfig c = base;
    c.name = "floor";
    c.options.stale_ms = 1000;
    c.options.retry_ms = 300;
    c.retry_min_ms = 50;
    c.max_delay_ms = 90;  // D_max < 100 ms, the margin at 1 s
    c.lost_prob = 0.03;
    c.crash_prob = 0.2;
    c.long_hold_prob = 0.4;
    c.write_every_max_ms = 40;
    out.push_back(c);
  }
  {  // Holds as a store task makes them: no renewals while the task runs,
     // writes checked against the lease, so long holds run their lease out
     // while writing and the lock is taken over. Delays up to 400 ms.
    SimConfig c = base;
    c.name = "store-holds";
    c.max_delay_ms = 480;  // D_max < 500 ms margin
    c.quick_delay_prob = 0.85;  // mostly quick, a few slow requests near D_max
    c.quick_delay_divisor = 40;
    c.withhold_renewals_prob = 0.8;
    c.long_hold_prob = 0.5;
    c.lost_prob = 0.02;
    c.options.retry_ms = 300;
    c.retry_min_ms = 50;
    c.write_every_max_ms = 20;
    out.push_back(c);
  }
  {  // Beyond realistic bounds: creation rows visible only after more than the
     // stale window (CREATE ... AS SELECT stalled for minutes at the default
     // window). Run by lock_sim_long, not by the test.
    SimConfig c = base;
    c.name = "extreme-visibility";
    c.max_delay_ms = 250;  // D_max < 500 ms margin
    c.create_visibility_prob = 0.5;
    c.create_visibility_max_ms = 12000;
    c.lost_prob = 0.05;
    c.long_hold_prob = 0.3;
    c.max_contenders = 4;
    out.push_back(c);
  }
  // ---- the same lock through a whole store (LockKind::kStore) ----
  // Each configuration again, driven as a host drives a chstate::Connection:
  // the transport policy's resends, renewals when called back at
  // PollTimeout, release and cancellation by the store. This is where a
  // resend the lock machine never sees (a DROP sent twice) shows.
  {
    const std::vector<std::string> through_store = {"no-faults", "delays-and-losses", "visibility-renewals",
                                                    "crashes",   "cancels",           "clock-offsets",
                                                    "long-holds", "everything",       "floor"};
    const size_t machine_configs = out.size();
    for (size_t i = 0; i < machine_configs; ++i) {
      for (const std::string& name : through_store) {
        if (out[i].name != name) continue;
        SimConfig c = out[i];
        c.name = "store/" + name;
        c.lock = LockKind::kStore;
        out.push_back(c);
      }
    }
  }
  // ---- linger_locks: a contender keeps its store across rounds ----
  // Releases linger and the next round takes the lock back with no request;
  // waiters show themselves and the holder yields; idle lingering locks go at
  // the store's timer. Hazards: pauses between rounds (no timers, no
  // answers) up to three stale windows, crashes while a lock lingers, clock
  // rates off by up to 2% (the margin is a tenth of the window), lost answers
  // and delays. Rounds follow each other quickly, so the lock is mostly
  // taken back.
  for (const std::string& name : std::vector<std::string>{"no-faults", "delays-and-losses", "crashes", "everything"}) {
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].name != name) continue;
      SimConfig c = out[i];
      c.name = "store/linger-" + name;
      c.lock = LockKind::kStore;
      c.linger = true;
      c.rounds = 6;
      c.think_max_ms = 60;
      c.pause_prob = 0.15;
      c.pause_max_ms = 3 * c.options.stale_ms;
      c.max_clock_rate_ppm = 20000;
      c.expect_no_failures = false;  // pauses are a fault: a paused holder's lock is taken over
      out.push_back(c);
      break;
    }
  }
  // ---- cluster mode: the lock as claims, with replicas failing ----
  // Claims (quorum inserts) refused with 286 (another in flight) and 285 (too
  // few replicas), confirmed late (319: the row lands up to 3 s later, or
  // never), and reads on a lagging replica refused (289); on top of each
  // configuration's own faults.
  for (const std::string& name :
       std::vector<std::string>{"no-faults", "delays-and-losses", "crashes", "long-holds", "many-contenders",
                                "cancels", "everything"}) {
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].name != name) continue;
      SimConfig c = out[i];
      c.name = "cluster/" + name;
      c.cluster = true;
      // A release is one row that is not a write under the lock (it ends
      // only the holder's own claim): holders write state more often instead.
      c.write_every_max_ms = 50;
      if (name != "no-faults") AddReplicaFaults(c);
      out.push_back(c);
      break;
    }
  }
  // Cluster mode with contenders of different stale windows (2 to 12 s) and
  // retries, as mixed-settings, with the replicas' faults above: a claimant
  // judges another's claim by the longer of the two windows.
  {
    SimConfig c = Named(out, "mixed-settings");
    c.name = "cluster/mixed-settings";
    c.cluster = true;
    c.write_every_max_ms = 50;
    AddReplicaFaults(c);
    out.push_back(c);
  }
  // A server that refuses connections for up to 3 s at a time (a restart),
  // a period starting within 2 s of the last: requests are resent by the
  // transport policy, then the lock decides (an unreachable server is not a
  // busy lock). One server, and the cluster with its faults.
  for (const std::string& name : std::vector<std::string>{"delays-and-losses", "cluster/delays-and-losses"}) {
    SimConfig c = Named(out, name);
    c.name = name == "delays-and-losses" ? "refusals" : "cluster/refusals";
    c.refuse_every_max_ms = 2000;
    c.refuse_max_ms = 3000;
    out.push_back(c);
  }
  // Cluster mode with the claims replica lagging for long: periods of up to
  // 4 s (half a stale window) in which every claims read is refused with
  // 289, within 2 s of each other, besides the occasional lagging read.
  {
    SimConfig c = Named(out, "cluster/crashes");
    c.name = "cluster/long-lag";
    c.lag_every_max_ms = 2000;
    c.lag_max_ms = 4000;
    out.push_back(c);
  }
  // Host lists: the lock through whole stores in cluster mode, each store
  // given 3 or 4 hosts, replicas of the one server. One host is dead (it
  // refuses every connection for the whole schedule: a replica that is
  // gone); each other one refuses connections in periods of its own. Each
  // contender keeps its store over 3 rounds, so what it learnt about its
  // hosts (the endpoints' down marks, 5 s) outlives a round.
  // - cluster/hosts: otherwise healthy (delays up to 250 ms), the live hosts
  //   refusing for up to 1.5 s, a period starting within 15 s of the last:
  //   the dead host is tried about once per 5 s per store.
  // - cluster/hosts-everything: on cluster/delays-and-losses (the replicas'
  //   faults, lost answers, delays up to 400 ms), the live hosts refusing for
  //   up to 2 s within 4 s of the last: every host is often marked down, and
  //   then the one whose mark runs out first (often the dead one) is tried.
  for (const std::string& name : std::vector<std::string>{"cluster/no-faults", "cluster/delays-and-losses"}) {
    SimConfig c = Named(out, name);
    const bool healthy = name == "cluster/no-faults";
    c.name = healthy ? "cluster/hosts" : "cluster/hosts-everything";
    c.lock = LockKind::kStore;
    c.keep_store = true;
    c.rounds = 3;
    c.min_hosts = 3;
    c.max_hosts = 4;
    if (healthy) {
      c.max_delay_ms = 250;
      c.expect_no_failures = false;  // every live host may refuse at once
      c.expect_dead_host_within_budget = true;
    }
    c.host_refuse_every_max_ms = healthy ? 15000 : 4000;
    c.host_refuse_max_ms = healthy ? 1500 : 2000;
    out.push_back(c);
  }
  // Replicas that miss claims for a while: with 4 hosts (one dead), each a
  // replica of the claims table, a claims row is on its quorum of 2 when
  // confirmed and reaches the third live one up to 3 s later (18.16 makes sure only that
  // the replica read has the last confirmed row; tests/cluster/
  // test_claims_gap.py). The stores read enough replicas: exclusion holds.
  // Its negative control, a server that says the table has one replica (so
  // the stores read one), must be caught.
  for (const bool understated : {false, true}) {
    SimConfig c = Named(out, "cluster/hosts");
    c.name = understated ? "cluster/replica-gaps-one-read" : "cluster/replica-gaps";
    c.min_hosts = c.max_hosts = 4;
    c.replica_fetch_max_ms = 3000;
    c.min_contenders = 3;
    c.max_contenders = 5;
    // A read needs three of the four replicas, every live one: after those
    // answered or refused, the dead host is the one left (sends "forced").
    c.expect_dead_host_within_budget = false;
    // Claims not confirmed in time (319), on the replica they went to at once
    // and on the others later or never: never held.
    c.quorum_unknown_prob = 0.05;
    c.quorum_unknown_max_ms = 2000;
    if (understated) {
      c.replicas_understated = true;
      c.expect_violations = true;
      c.check_progress = false;
    }
    out.push_back(c);
  }
  // Cluster mode with a pruner removing old claims all the time (a prune
  // every 2 s at most, each row going up to 1.5 s after it lands), as
  // acquisitions that found many old claims do: exclusion and progress must
  // hold as before.
  for (const std::string& name : std::vector<std::string>{"no-faults", "crashes", "long-holds", "everything"}) {
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].name != "cluster/" + name) continue;
      SimConfig c = out[i];
      c.name = "cluster/pruned-" + name;
      c.prune_every_max_ms = 2000;
      c.prune_lag_max_ms = 1500;
      out.push_back(c);
      break;
    }
  }
  // ---- negative controls: the checker must catch these ----
  {  // Cluster: a pruner that removes live claims too: a holder's claim
     // gone, the next claimant sees the lock free while the holder writes.
    SimConfig c = base;
    c.name = "cluster/prune-live-claims";
    c.expect_violations = true;
    c.cluster = true;
    c.prune_every_max_ms = 500;
    c.prune_live_claims = true;
    c.min_contenders = 3;
    c.max_contenders = 4;
    c.rounds = 3;
    c.max_delay_ms = 250;
    c.long_hold_prob = 0.5;
    c.write_every_max_ms = 50;
    c.check_progress = false;
    out.push_back(c);
  }
  {  // Cluster: a claim that holds as soon as it is written, without reading
     // the claims again, overlaps a racer that claimed at the same time.
    SimConfig c = base;
    c.name = "cluster/claim-without-second-read";
    c.expect_violations = true;
    c.cluster = true;
    c.defects.claim_without_second_read = true;
    c.min_contenders = 3;
    c.max_contenders = 5;
    c.rounds = 3;
    c.max_delay_ms = 250;
    c.check_progress = false;
    out.push_back(c);
  }
  // ---- a mixed fleet: chstate (python_locks) and the Python backend ----
  // Even contenders are chstate stores, odd ones processes of the Python
  // backend's lock (tests/sim/python_backend_lock.h) in its published and
  // its older version, on one id. Background merges of `<table>_lock` every
  // 1.5 s at most; each Python step held back up to 4 s with probability
  // 0.3 (longer than its 1 s settle: a slow client or a server answering
  // late); lost answers. The stale window is drawn from 1..5 s, so a chstate
  // holder renews its lock and its marker several times per hold.
  for (int version : {1, 2}) {
    SimConfig c = base;
    c.name = version == 1 ? "mixed/published" : "mixed/old";
    c.lock = LockKind::kStore;
    c.python = version;
    c.min_contenders = 2;
    c.max_contenders = 4;
    c.rounds = 3;
    c.max_delay_ms = 80;  // below the 100 ms margin of the 1 s floor
    c.stale_min_ms = 1000;
    c.merge_every_max_ms = 1500;
    c.python_pause_prob = 0.3;
    c.python_pause_max_ms = 4000;
    c.lost_prob = 0.02;
    c.long_hold_prob = 0.2;
    out.push_back(c);
  }
  {
    // Negative control: chstate's marker as before (uuid4s beat it in min(),
    // a newer Python row merges it away) and no block check.
    SimConfig c = out.back();
    c.name = "mixed/old-marker";
    c.python = 1;
    c.old_marker = true;
    c.expect_violations = true;
    c.check_progress = false;
    out.push_back(c);
  }
  {
    SimConfig c = base;
    c.name = "naive-rmt";
    c.expect_violations = true;
    c.lock = LockKind::kNaive;
    c.min_contenders = 2;
    c.max_contenders = 4;
    c.rounds = 3;
    c.max_delay_ms = 250;  // D_max < 500 ms margin
    c.insert_visibility_max_ms = 1500;
    c.merge_every_max_ms = 2000;
    c.check_progress = false;
    out.push_back(c);
  }
  {
    SimConfig c = base;
    c.name = "ignore-lease";
    c.expect_violations = true;
    c.ignore_lease = true;
    c.min_contenders = 2;
    c.max_contenders = 2;
    c.rounds = 2;
    c.check_progress = false;
    out.push_back(c);
  }
  // The machine with one defence removed (LockDefectsForTesting). Each runs
  // a configuration the production machine passes (lock_sim_test checks that
  // too), so the violations found are the missing defence's.
  {  // (a) No lease margin: holds that run no renewals (as a store task
     // does) end exactly at the stale window, and the last write, sent just
     // inside it, lands up to D_max later, after a taker moved the lock.
    SimConfig c = base;
    c.name = "zero-margin";
    c.expect_violations = true;
    c.defects.zero_margin = true;
    c.max_delay_ms = 480;  // still below the 500 ms margin: the machine passes it
    c.quick_delay_prob = 0.85;  // takers answered quickly, a few slow writes
    c.quick_delay_divisor = 40;
    c.withhold_renewals_prob = 0.8;
    c.long_hold_prob = 0.8;
    c.options.retry_ms = 300;
    c.retry_min_ms = 50;
    c.write_every_max_ms = 20;
    c.check_progress = false;
    out.push_back(c);
  }
  {  // (b) A renewal that confirms whoever holds the table. Within D_max
     // the margin alone already keeps a renewal from meeting another holder
     // (a takeover needs our newest row stale, and the lease counts from
     // before that row), so this control has some renewal INSERTs stall
     // beyond D_max (4.2-5.5 s at a 5 s window): they land in the taker's
     // table. Confirming the holder makes the machine give up; accepting
     // any holder revives the lease and the holder writes state under the
     // taker's lock. The production machine is immune here: besides the
     // holder check, a confirmation that arrives after the lease ran out
     // never revives it (a stalled row landing between a taker's look and
     // its RENAME used to be confirmed as ours).
    SimConfig c = base;
    c.name = "renewal-accepts-any-holder";
    c.expect_violations = true;
    c.defects.renewal_accepts_any_holder = true;
    // A stalled renewal's confirmation comes after the lease ran out, and the
    // machine never revives an expired lease: that defence is removed too,
    // or it alone would hide this one (lock_defences_test checks each alone).
    c.defects.revive_expired_lease = true;
    c.max_delay_ms = 250;
    c.slow_renewal_prob = 0.5;
    c.slow_renewal_min_ms = 4200;
    c.slow_renewal_max_ms = 5500;
    c.long_hold_prob = 0.8;
    c.options.retry_ms = 300;
    c.retry_min_ms = 50;
    c.check_progress = false;
    out.push_back(c);
  }
  {  // (c) A taker that judges staleness by its own (shorter) window only.
    SimConfig c = base;
    c.name = "ignore-holder-window";
    c.expect_violations = true;
    c.defects.ignore_holder_window = true;
    c.per_contender_settings = true;
    c.stale_min_ms = 1000;
    c.options.stale_ms = 12000;
    c.whole_second_stale = true;
    c.max_delay_ms = 80;
    c.long_hold_prob = 0.6;
    c.check_progress = false;
    out.push_back(c);
  }
  {  // Beyond the stated assumption: one-way delays up to 1.5 s, three times
     // the 500 ms margin. The production machine is EXPECTED to be caught
     // here (a write sent inside the lease lands after a takeover): the
     // simulation can see the hazard the assumption excludes.
    SimConfig c = base;
    c.name = "stress";
    c.expect_violations = true;
    c.max_delay_ms = 1500;
    c.quick_delay_prob = 0.85;
    c.quick_delay_divisor = 40;
    c.lost_prob = 0.05;
    c.withhold_renewals_prob = 0.5;
    c.long_hold_prob = 0.6;
    c.options.retry_ms = 300;
    c.retry_min_ms = 50;
    c.check_progress = false;
    out.push_back(c);
  }
  return out;
}

std::optional<SimConfig> ConfigByName(const std::string& name) {
  for (SimConfig& c : Configs()) {
    if (c.name == name) return c;
  }
  return std::nullopt;
}

void Summary::Add(const ScheduleResult& r) {
  if (config.empty()) config = r.config;
  ++schedules;
  events += r.events;
  acquisitions += r.acquisitions;
  takeovers += r.takeovers;
  python_overlaps += r.python_overlaps;
  orphan_overlaps += r.orphan_overlaps;
  marker_merge_overlaps += r.marker_merge_overlaps;
  failures += r.failures;
  losses += r.losses;
  crashed += r.crashed;
  revivals += r.revivals;
  writes_landed += r.writes_landed;
  overlaps += r.overlaps;
  renewal_row_overlaps += r.renewal_row_overlaps;
  prunes += r.prunes;
  host_sends += r.host_sends;
  dead_host_sends += r.dead_host_sends;
  dead_host_sends_forced += r.dead_host_sends_forced;
  dead_host_budget += r.dead_host_budget;
  host_refusals += r.host_refusals;
  host_rule_breaks += r.host_rule_breaks;
  taken_back += r.taken_back;
  pauses += r.pauses;
  longest_delay_ms = std::max(longest_delay_ms, r.longest_delay_ms);
  max_contenders = std::max(max_contenders, r.contenders);
  violations += static_cast<int64_t>(r.violations.size());
  if (!r.ok()) {
    ++failed_schedules;
    if (failing_seeds.size() < 5) failing_seeds.push_back(r.seed);
  }
}

std::string Summary::HostsLine() const {
  if (host_sends == 0) return "";
  return absl::StrFormat(
      "%s: %d requests to hosts, %d refused by a live host; %d to the dead host (%.1f%%), %d of them while it was "
      "marked down (every other host down or tried); at most one per host_down_ms per store: %d; sends "
      "against the host list's rule: %d\n",
      config, host_sends, host_refusals, dead_host_sends, 100.0 * dead_host_sends / host_sends,
      dead_host_sends_forced, dead_host_budget, host_rule_breaks);
}

std::string FormatSummaries(const std::vector<Summary>& rows) {
  constexpr char kRow[] = "%-27s %10d %12d %12d %10d %9d %9d %8d %8d %6d %11d %9d %8d %10d %8d\n";
  std::string out = absl::StrFormat("%-27s %10s %12s %12s %10s %9s %9s %8s %8s %6s %11s %9s %8s %10s %8s\n", "config",
                                    "schedules", "events", "acquired", "takeovers", "failures", "losses", "crashed",
                                    "revived", "max K", "writes", "max delay", "overlaps", "violations", "bad");
  Summary total;
  total.config = "TOTAL";
  auto row = [&](const Summary& s) {
    absl::StrAppendFormat(&out, kRow, s.config, s.schedules, s.events, s.acquisitions, s.takeovers, s.failures,
                          s.losses, s.crashed, s.revivals, s.max_contenders, s.writes_landed, s.longest_delay_ms,
                          s.overlaps, s.violations, s.failed_schedules);
  };
  for (const Summary& s : rows) {
    row(s);
    total.schedules += s.schedules;
    total.events += s.events;
    total.acquisitions += s.acquisitions;
    total.takeovers += s.takeovers;
    total.failures += s.failures;
    total.losses += s.losses;
    total.crashed += s.crashed;
    total.revivals += s.revivals;
    total.writes_landed += s.writes_landed;
    total.longest_delay_ms = std::max(total.longest_delay_ms, s.longest_delay_ms);
    total.overlaps += s.overlaps;
    total.max_contenders = std::max(total.max_contenders, s.max_contenders);
    total.violations += s.violations;
    total.failed_schedules += s.failed_schedules;
  }
  row(total);
  return out;
}

}  // namespace chstate::sim
