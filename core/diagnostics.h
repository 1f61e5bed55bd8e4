// What a store tells a person watching it, beside its results: why a run
// waits (a lock held by another process, since when, how much longer), what
// the transport policy did (a request resent, a host marked down), what the
// lock did (acquired after a wait, renewed, lost, a lingering lock yielded
// to a waiter) and, at debug level, each statement with its time. The core
// emits them; each host routes them the way its users expect (the Meltano
// adapter to Python logging, the CLI to stderr with -v/-vv, Lua to a
// callback, Node to onEvent). No diagnostic carries a password or a state's
// contents: statements are shown with state literals redacted unless the
// host asks otherwise.
//
//   store->diagnostics().set_level(chstate::DiagnosticLevel::kDebug);
//   ... drive the store (core/connection.h) ...
//   while (std::optional<chstate::Diagnostic> d = conn.PollDiagnostic()) log(d->message);
#ifndef CHSTATE_CORE_DIAGNOSTICS_H_
#define CHSTATE_CORE_DIAGNOSTICS_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace chstate {

// How much a host wants to hear; each diagnostic has one of the first three.
enum class DiagnosticLevel {
  kWarning,  // something went wrong that the run survives or must hear (a lease lost)
  kInfo,     // why a run waits or changed course (waiting for a lock, a host down, a resend)
  kDebug,    // the detail (each statement and its time, renewals, history upkeep)
  kNone,     // as a threshold: nothing
};

enum class DiagnosticKind {
  kLockWaiting,    // another process holds the lock: holder, held for, validity left, next try
  kLockAcquired,   // acquired after waiting (waited_ms)
  kLeaseRenewed,   // a held lock's lease renewed
  kLeaseLost,      // a held lock found lost, or its lease ran out
  kLockYielded,    // a lingering lock released for a waiting process
  kResent,         // a request sent again (why, attempt N of M)
  kHostDown,       // a host marked down, and the host chosen next
  kQuorumBusy,     // a quorum write waits out code 286/252
  kHistoryPruned,  // an id's history kept in bounds
  kStatement,      // one statement, its time and its outcome (debug)
};

const char* DiagnosticKindName(DiagnosticKind kind);
const char* DiagnosticLevelName(DiagnosticLevel level);

struct Diagnostic {
  DiagnosticKind kind = DiagnosticKind::kStatement;
  DiagnosticLevel level = DiagnosticLevel::kInfo;
  int64_t at_ms = 0;        // the host's clock when it happened
  std::string state_id;     // the id it concerns, or "" (raw bytes: hosts show it printable)
  std::string message;      // one sentence for a person
  // Facts for machines (a JSON log line, a test), by name: numbers in
  // milliseconds or counts, texts such as a holder's lock id or a host.
  std::vector<std::pair<std::string, int64_t>> numbers;
  std::vector<std::pair<std::string, std::string>> texts;
};

// The queue a store's diagnostics wait in until its host takes them. A
// diagnostic below the level is not made at all (Wants), so a host that
// asks for nothing pays nothing.
class Diagnostics {
 public:
  void set_level(DiagnosticLevel level) { level_ = level; }
  DiagnosticLevel level() const { return level_; }
  // Statements at debug level show state literals as "<state: N bytes>"
  // unless this is false.
  void set_redact_states(bool redact) { redact_states_ = redact; }
  bool redact_states() const { return redact_states_; }

  bool Wants(DiagnosticLevel level) const { return level_ != DiagnosticLevel::kNone && level <= level_; }
  void Emit(Diagnostic d);
  std::optional<Diagnostic> Poll();
  bool empty() const { return queue_.empty(); }

 private:
  // Not unbounded: a host that never takes them keeps the newest.
  static constexpr size_t kMaxQueued = 1000;
  DiagnosticLevel level_ = DiagnosticLevel::kNone;
  bool redact_states_ = true;
  std::deque<Diagnostic> queue_;
};

// The diagnostic as one line of a log, what every host shows: its message,
// and for a statement the statement itself after ": " (as told: states
// redacted unless the host asked for them), its line breaks as spaces.
std::string DiagnosticLine(const Diagnostic& d);

// `sql` with every string literal that holds a JSON object (a state's
// partial or completed side) replaced by '<state: N bytes>'.
std::string RedactStates(absl::string_view sql);

}  // namespace chstate

#endif  // CHSTATE_CORE_DIAGNOSTICS_H_
