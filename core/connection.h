// One store as a single sans-IO object a host pumps, in the shape of
// quinn-proto's Connection: inputs (start an operation, an answer, a timeout)
// change its state; outputs are polled.
//
//   chstate::Connection conn(std::move(store));
//   uint64_t op = conn.Start(conn.store().Update(incoming), {now_ms, random});
//   for (;;) {
//     while (auto t = conn.PollTransmit()) {
//       // send t->request (give up at t->deadline_ms), then:
//       conn.HandleResponse(t->op, answer, {now_ms, random});
//     }
//     while (auto e = conn.PollEvent()) { /* e->op finished: e->result or e->status */ }
//     if (auto at = conn.PollTimeout()) { sleep until *at; conn.HandleTimeout({now_ms, random}); }
//     else break;  // nothing in flight, no timer: idle
//   }
//
// What it owns, for every host alike:
// - Operations run one at a time in the order they were started (a store's
//   tasks share its held locks and dialect); a later one waits its turn.
// - Every timer: an operation's waits (lock retry, resend back-off, mutation
//   polls) and the renewal of held locks. While no operation runs and the
//   store holds a lock, PollTimeout() is the next renewal: a host that holds
//   a lock for long only keeps calling HandleTimeout at PollTimeout(), and
//   the renewal runs as an internal operation (Store::Tick). A lock found
//   lost then is an event with `renewal` set and code kAborted.
// - Resends and their back-off (core/task.h), and each request's deadline.
//
// HandleResponse and HandleTimeout never fail the connection: an answer for
// an operation that is not waiting for one (a host bug, or an operation the
// host abandoned) is refused with kFailedPrecondition and changes nothing.
#ifndef CHSTATE_CORE_CONNECTION_H_
#define CHSTATE_CORE_CONNECTION_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "core/sql_request.h"
#include "core/store.h"
#include "core/task.h"

namespace chstate {

// A request to send: answer it with HandleResponse(op, ...).
struct Transmit {
  uint64_t op = 0;
  SqlRequest request;
  int64_t deadline_ms = 0;  // host clock: report a transport failure if no answer by then
};

// An operation ended.
struct OpEvent {
  uint64_t op = 0;
  bool ok = false;
  Result result;         // ok
  absl::Status status;   // !ok: one of the codes in core/store.h's error contract
  bool renewal = false;  // the connection's own renewal of held locks (not a started op)
};

// What a host that drives one operation at a time acts on next (the
// protocol's one action per input, hosts/common/protocol.h): the
// connection's outputs in the order they matter.
struct ConnectionOutput {
  enum class Kind {
    kEnded,     // an operation ended: `event` (a started one, or the connection's renewal that found a lock lost)
    kTransmit,  // send `transmit` and answer it
    kWait,      // the running operation waits until `at_ms`; then HandleTimeout
    kIdle,      // nothing runs: call HandleTimeout at `at_ms` if set (a held lock's renewal)
  };
  Kind kind = Kind::kIdle;
  OpEvent event;
  Transmit transmit;
  std::optional<int64_t> at_ms;
};

class Connection {
 public:
  explicit Connection(std::unique_ptr<Store> store) : owned_(std::move(store)), store_(owned_.get()) {}
  // Borrows `store`, which must outlive the connection.
  explicit Connection(Store* store) : store_(store) {}

  // The store, for building tasks (Get, Update, AcquireLock, ...) and its
  // read-only questions (LeaseValid). Tasks must run through Start.
  Store& store() { return *store_; }
  const Store& store() const { return *store_; }

  // Queues `task`; it starts now if nothing else runs. Returns its op id (>= 1).
  uint64_t Start(std::unique_ptr<Task> task, const Inputs& in);
  // The answer to the request Transmit gave for `op`.
  absl::Status HandleResponse(uint64_t op, const SqlResponse& response, const Inputs& in);
  // Fires every timer whose time (PollTimeout) has come; earlier is a no-op.
  void HandleTimeout(const Inputs& in);
  // Forgets `op` (queued or running) without an event: its answer, should
  // one still come, is refused, and the next queued op starts. A lock it was
  // acquiring is not held by the store; if its CREATE landed, that lock
  // expires after the stale window.
  void Abandon(uint64_t op, const Inputs& in);

  std::optional<Transmit> PollTransmit();
  std::optional<int64_t> PollTimeout() const;
  std::optional<OpEvent> PollEvent();
  // What the store told (core/diagnostics.h), oldest first; nothing unless
  // the host set a level on store().diagnostics().
  std::optional<Diagnostic> PollDiagnostic() { return store_->diagnostics().Poll(); }

  // The next output (ConnectionOutput): an event first, then a request,
  // else what the connection waits for. Events and requests are taken.
  ConnectionOutput Poll();

  // No operation running or queued.
  bool idle() const { return !current_ && queue_.empty(); }
  // The running operation (its id; 0 when none), and whether it waits for
  // the answer to a request it was given (else for its timer).
  uint64_t running() const { return current_ ? current_->id : 0; }
  // (The task knows which: the connection keeps no phase of its own.)
  bool awaiting_answer() const { return current_ && current_->task->awaiting_answer(); }

 private:
  struct Op {
    uint64_t id = 0;
    std::unique_ptr<Task> task;
    bool renewal = false;
  };
  void Take(Action action, const Inputs& in);
  void StartNext(const Inputs& in);

  std::unique_ptr<Store> owned_;
  Store* store_;
  std::deque<Op> queue_;
  std::optional<Op> current_;
  std::deque<Transmit> transmits_;
  std::deque<OpEvent> events_;
  uint64_t next_id_ = 1;
};

}  // namespace chstate

#endif  // CHSTATE_CORE_CONNECTION_H_
