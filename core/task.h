// A store operation in progress, driven by a host. The core never blocks,
// sleeps or sends: it says what to do next and waits to be told what happened.
//
//   std::unique_ptr<chstate::Task> task = store.Get("dev:tap-a-to-target-b");
//   chstate::Action a = task->Start({now_ms, random_bytes});
//   while (true) {
//     if (a.kind == chstate::Action::Kind::kRunSql) {
//       // send a.request once, waiting at most a.request.timeout_ms
//       a = task->OnResponse(transport.Run(a.request), {now_ms, random_bytes});
//     } else if (a.kind == chstate::Action::Kind::kWait) {
//       sleep_for(a.wait_ms);
//       a = task->OnTimer({now_ms, random_bytes});
//     } else break;   // kDone: a.result; kFailed: a.status
//   }
//
// "After every input, take the next action": a task emits exactly one action
// per input. Calling an input the task did not ask for (OnTimer while it
// waits for SQL, anything after kDone/kFailed) returns kFailed with
// kFailedPrecondition and leaves the task finished.
//
// Transport failures are the task's business, not the host's: a host sends
// each request exactly once and reports what happened (SqlResponse with
// transport_ok = false and whether the request may have been delivered). The
// task then decides, for every host alike (TransportPolicy):
//   - a request that cannot do harm twice (idempotent, or one that provably
//     never left: maybe_delivered = false) is sent again after a back-off
//     wait, up to `attempts` sends in all; the resend carries attempt + 1;
//   - any other failure goes to the step that sent the request, which knows
//     how to resolve it (the lock inspects its table; a write reports
//     kUnavailable with the outcome unknown) and never resends it blindly;
//   - a request acting under a lock (SqlRequest::send_before_ms) is sent,
//     first or again, only before its lease ends; past it the step gets the
//     last answer (or a "not sent" failure) and ends the operation.
#ifndef CHSTATE_CORE_TASK_H_
#define CHSTATE_CORE_TASK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/defaults.h"
#include "core/diagnostics.h"
#include "core/dialect.h"
#include "core/endpoints.h"
#include "core/op.h"
#include "core/sql_request.h"
#include "core/state.h"
#include "core/timers.h"

namespace chstate {

// What the host supplies with every input: the time (milliseconds on any
// monotonic scale; only differences matter) and fresh random bytes (16 or more
// when the task may need them; lock ids and insert tokens are made from them).
struct Inputs {
  int64_t now_ms = 0;
  std::string random;
};

// One version of a state in its history (Store::History).
struct StateVersion {
  std::string version;      // "<unix ms>-<hash8>": what Store::Rollback takes
  int64_t unix_ms = 0;      // when it was written, by the server's clock
  std::string updated_at;   // the same as ISO 8601 UTC, "2026-12-01T20:01:02Z"
  MeltanoState state;
  bool current = false;     // what the state table holds now
};

// A lock some process holds (Store::Locks, Store::ForceUnlock). Times are the
// server's.
struct HeldLockInfo {
  std::optional<std::string> state_id;  // nullopt: an id with no state yet (only its table is known)
  std::string table;                    // the lock table
  std::string holder;                   // the holder's lock id ("" while its creation row is not visible)
  int64_t held_s = 0;                   // since it was taken
  int64_t renewed_s = 0;                // since it was last renewed (or taken)
  int64_t validity_s = 0;               // the holder's window (0: not known yet)
  bool stale = false;                   // past its window: the next taker takes it over
};

// What a finished task produced. Which fields are set depends on the task.
struct Result {
  std::optional<MeltanoState> state;    // Get: nullopt when the id is absent; Rollback: what was restored
  std::vector<std::string> state_ids;   // List; ExportPage with document: the page's ids
  // ExportPage: one page, sorted by id (set, maybe empty, only by ExportPage).
  std::optional<std::vector<MeltanoState>> states;
  // ExportPage with document, instead of states: the page's entries of
  // Meltano's export document ("<id>": {"completed": ..., "partial": ...}),
  // ",\n  " between them (set, maybe empty, only then).
  std::optional<std::string> document;
  bool more = false;                    // ExportPage: more may follow; ask for the next after its last id
  // Locks (set, maybe empty, only by Locks); ForceUnlock: the one removed.
  std::optional<std::vector<HeldLockInfo>> locks;
  // History: newest first (set, maybe empty, only by History).
  std::optional<std::vector<StateVersion>> versions;
  int64_t count = 0;                    // ClearAll: states removed
  std::string server_version;           // Ping, and every task that connected
  std::optional<Dialect> dialect;
  std::string lock_id;                  // AcquireLock
  int64_t waited_ms = 0;                // AcquireLock: time from start to acquired
  // When the store next needs Store::Tick (a held lock's renewal), on the
  // host's clock; nullopt when it holds no lock.
  std::optional<int64_t> next_timeout_ms;
};

// What a task does after a transport failure (see the file comment).
struct TransportPolicy {
  int attempts = kDefaultTransportAttempts;          // sends of one request in all
  int64_t backoff_ms = kDefaultTransportBackoffMs;   // before the first resend, doubled after
  int64_t request_timeout_ms = kDefaultRequestTimeoutMs;  // stamped on every request
  // Several hosts (docs/cluster.md), shared by the store's tasks; null:
  // the host's one server. With hosts, every request carries the endpoint it
  // goes to, and a request that may be sent again (MayResend, or a
  // replica-level error: ReplicaLevelError) goes to each other host at once
  // before the back-off above; one attempt is one round of the hosts.
  std::shared_ptr<Endpoints> endpoints;
  // Where the task tells what it did (resends, hosts marked down, each
  // statement's time); null: nowhere. The store's own (Store::diagnostics).
  Diagnostics* diagnostics = nullptr;
  // Where the task keeps its waits' deadlines: the store's timer table;
  // null: a table of the task's own.
  TimerTable* timers = nullptr;
};

// True when `request` may be sent again after `response` (a transport
// failure): resending cannot do harm.
bool MayResend(const SqlRequest& request, const SqlResponse& response);
// True when `request` acts under a lock whose lease has run out by `now_ms`
// (SqlRequest::send_before_ms): the task sends it no more, to no host.
bool PastSendBefore(const SqlRequest& request, int64_t now_ms);
// True when `response` is an error of the one server that sent it, which
// another replica may not have, and which left nothing written: it lags
// behind the last quorum write (code 289), lost its ZooKeeper session (225,
// 242), is overloaded (202); for idempotent requests also a ZooKeeper or
// network error on its side (999, 210). With several hosts the request goes
// to another one.
bool ReplicaLevelError(const SqlRequest& request, const SqlResponse& response);

struct Action {
  enum class Kind { kRunSql, kWait, kDone, kFailed };
  Kind kind = Kind::kFailed;
  SqlRequest request;  // kRunSql
  int64_t wait_ms = 0; // kWait
  Result result;       // kDone
  absl::Status status; // kFailed
};

// Runs one operation: the stack of its parts (core/op.h), and the transport
// policy for every request they send.
class Task {
 public:
  explicit Task(TransportPolicy policy = {});
  // What the task runs, given once before Start: its root op, and whatever
  // the root's parts refer to (kept alive as long as the task).
  void Run(std::shared_ptr<void> context, std::unique_ptr<Op> root);
  // The latest Inputs the host gave, for ops that need the time or
  // randomness.
  const Inputs* inputs() const { return &inputs_; }
  ~Task();
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;

  Action Start(const Inputs& in);
  Action OnResponse(const SqlResponse& response, const Inputs& in);
  Action OnTimer(const Inputs& in);
  bool finished() const { return phase_ == Phase::kFinished; }
  // It waits for the answer to the request it gave (kRunSql), or for its
  // timer (kWait, until WakeAt).
  bool awaiting_answer() const { return phase_ == Phase::kSql; }
  bool waiting() const { return phase_ == Phase::kTimer || phase_ == Phase::kResend; }
  // While the task waits (a kWait action): when its wait is over, on the
  // host's clock, from the timer table.
  std::optional<int64_t> WakeAt() const;
  // Where the task is: its stack of parts, outermost first, and what it
  // waits for ("update \"dev:a\" > writing state (sent, attempt 2)").
  std::string Where() const;

 private:
  // Where the task is. Each input is accepted in exactly one phase:
  //   kNew      --Start-------> (the root's first need)
  //   kSql      --OnResponse--> kResend (a failure MayResend allows) | (the op's next need)
  //   kTimer    --OnTimer-----> (the op's next need)
  //   kResend   --OnTimer-----> kSql (the same request, attempt + 1)
  //   (a need)  = kSql | kTimer | kFinished (done or failed)
  enum class Phase { kNew, kSql, kTimer, kResend, kFinished };

  // Runs parts until one needs the host (a request, a wait) or the root ends.
  Action Advance(Next next);
  Action Misuse(const char* what);
  Action SendPending();
  // Hands `response` to the op that sent the request (after every host of
  // a round failed, with what each one did).
  Action Deliver(const SqlResponse& response);
  // Starts a round of sends of the pending request: no host tried yet but
  // those of its not_to (while another host is left).
  void NewRound();
  // With several hosts: points the pending request at the next host of this
  // round (false when every host was tried).
  bool ChooseHost();
  // Diagnostics of the transport policy (no effect on what the task does).
  void Tell(DiagnosticKind kind, DiagnosticLevel level, std::string message,
            std::vector<std::pair<std::string, int64_t>> numbers, std::vector<std::pair<std::string, std::string>> texts);
  void TellStatement(const SqlResponse& response);

  struct Frame {
    std::unique_ptr<Op> op;
    bool tried = false;  // its parent hears about its failure (Next::Try)
  };
  std::vector<Frame> stack_;
  std::shared_ptr<void> context_;

  // This round's hosts, in the order tried, and what each answered.
  std::vector<size_t> tried_;
  std::vector<std::string> failures_;
  // The failure a resend waits out, for its op should the resend not go.
  SqlResponse last_failure_;

  TransportPolicy policy_;
  Inputs inputs_;
  SqlRequest pending_;   // kSql, kResend: the request in flight
  int64_t sent_at_ms_ = 0;  // kSql: when it was handed to the host
  // kTimer, kResend: what the task waits for, and how long; its deadline is
  // (waiting_for_, timer_id_) in the timer table.
  TimerKind waiting_for_ = TimerKind::kOpWait;
  int64_t wait_ms_ = 0;
  TimerTable own_timers_;
  TimerTable& timers() { return policy_.timers != nullptr ? *policy_.timers : own_timers_; }
  const TimerTable& timers() const { return policy_.timers != nullptr ? *policy_.timers : own_timers_; }
  std::string timer_id_;
  // Sets the task's one wait (clearing any other).
  void Wait(TimerKind kind, int64_t ms);
  void EndWait();
  Phase phase_ = Phase::kNew;
};

}  // namespace chstate

#endif  // CHSTATE_CORE_TASK_H_
