// The lock's transition table, its dispatch, and the handlers for holding
// and releasing. Every (state, event) pair the machine accepts is one row of
// kTable; any other pair is misuse and ends in kFailed. The handlers for
// acquiring are in lock_acquire.cc (the cluster claims' in lock_claims.cc);
// inspections are parsed in lock_inspection.cc.
#include "core/lock_machine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/clickhouse_errors.h"
#include "core/quoting.h"
#include "core/response.h"

namespace chstate {

namespace {

using Event = LockMachine::Event;

const char* EventName(Event e) {
  switch (e) {
    case Event::kAcquire: return "acquire";
    case Event::kRelease: return "release";
    case Event::kTimer: return "timer";
    case Event::kOk: return "ok";
    case Event::kExists: return "exists";
    case Event::kMissing: return "missing";
    case Event::kError: return "error";
  }
  return "?";
}

// Responses become events here, and only here.
Event Classify(const SqlResponse& r) {
  absl::Status s = CheckResponse(r, "locking");
  if (s.ok()) return Event::kOk;
  std::optional<int> code = ClickHouseCode(s);
  if (code == kCodeTableAlreadyExists) return Event::kExists;
  // A lock table being dropped by its releasing holder is as good as gone.
  if (code == kCodeUnknownTable || code == kCodeUnknownDatabase || code == kCodeTableIsDropped) {
    return Event::kMissing;
  }
  return Event::kError;
}

}  // namespace

const char* LockStateName(LockState s) {
  switch (s) {
    case LockState::kIdle: return "idle";
    case LockState::kCreating: return "creating";
    case LockState::kCreatingSchema: return "creating-schema";
    case LockState::kInspecting: return "inspecting";
    case LockState::kBackingOff: return "backing-off";
    case LockState::kEntombing: return "entombing";
    case LockState::kHeld: return "held";
    case LockState::kRenewing: return "renewing";
    case LockState::kConfirming: return "confirming";
    case LockState::kReleaseInspect: return "release-inspect";
    case LockState::kDropping: return "dropping";
    case LockState::kWithdrawing: return "withdrawing";
    case LockState::kReleased: return "released";
    case LockState::kFailed: return "failed";
    case LockState::kLost: return "lost";
  }
  return "?";
}

int64_t LockMachine::StaleSeconds() const { return (options_.stale_ms + 999) / 1000; }

int64_t LeaseMarginMs(const LockOptions& options) {
  return std::max<int64_t>(options.stale_ms / 10, 100);
}

int64_t LockMachine::MarginMs() const { return defects_.zero_margin ? 0 : LeaseMarginMs(options_); }

// ---- the transition table -------------------------------------------------

struct LockMachine::Transition {
  LockState from;
  Event event;
  void (LockMachine::*handle)(const SqlResponse*, const Inputs&);
  uint32_t to;  // the states the row may lead to (Dispatch checks it)
};

namespace {

template <typename... S>
constexpr uint32_t To(S... states) {
  return ((1u << static_cast<int>(states)) | ...);
}

using S = LockState;
// Where the shared outcomes lead.
// Cluster mode: StartCreate reads the claims first; a release is one row.
constexpr uint32_t kCreateAgain = To(S::kCreating, S::kFailed, S::kInspecting);  // StartCreate (or cancelled)
constexpr uint32_t kBecomeHolder = To(S::kHeld, S::kReleaseInspect, S::kDropping, S::kLost);  // held (or released)
constexpr uint32_t kBackOff = To(S::kBackingOff, S::kFailed);                    // wait (or time is up)
// Cluster mode: a claim that did not win is ended before the wait.
constexpr uint32_t kWithdraw = To(S::kWithdrawing) | kBackOff;

}  // namespace

// One row per (state, event) the machine accepts: its handler, and every
// state it may lead to. Rows whose handler consults release_requested_ (a
// release asked for while a request was in flight) list where that leads:
// an acquisition cancelled (kFailed), or a release started (kReleaseInspect).
// clang-format off
const LockMachine::Transition LockMachine::kTable[] = {
    // acquiring
    {S::kIdle,           Event::kAcquire, &LockMachine::StartCreate,       kCreateAgain},
    {S::kCreating,       Event::kOk,      &LockMachine::OnCreated,         kBecomeHolder | To(S::kInspecting)},
    {S::kCreating,       Event::kExists,  &LockMachine::Inspect,           To(S::kInspecting)},
    {S::kCreating,       Event::kMissing, &LockMachine::CreateSchema,      To(S::kCreatingSchema, S::kFailed)},
    {S::kCreating,       Event::kError,   &LockMachine::CreateUncertain,   To(S::kInspecting, S::kFailed, S::kCreating) |
                                                                           kBackOff},
    {S::kCreating,       Event::kTimer,   &LockMachine::ResendBusy,        To(S::kCreating)},
    {S::kCreating,       Event::kRelease, &LockMachine::NoteRelease,       To(S::kCreating)},
    {S::kCreatingSchema, Event::kOk,      &LockMachine::StartCreate,       kCreateAgain},
    {S::kCreatingSchema, Event::kExists,  &LockMachine::FailWithResponse,  To(S::kFailed)},
    {S::kCreatingSchema, Event::kMissing, &LockMachine::FailWithResponse,  To(S::kFailed)},
    {S::kCreatingSchema, Event::kError,   &LockMachine::SchemaMaybeMade,   kCreateAgain},
    {S::kCreatingSchema, Event::kRelease, &LockMachine::NoteRelease,       To(S::kCreatingSchema)},
    {S::kInspecting,     Event::kOk,      &LockMachine::Decide,            kBecomeHolder | kCreateAgain | kWithdraw |
                                                                           To(S::kEntombing)},
    {S::kInspecting,     Event::kMissing, &LockMachine::NoLock,            kCreateAgain | kWithdraw},
    {S::kInspecting,     Event::kExists,  &LockMachine::FailWithResponse,  To(S::kFailed)},
    {S::kInspecting,     Event::kError,   &LockMachine::InspectFailed,     kWithdraw},
    {S::kInspecting,     Event::kRelease, &LockMachine::NoteRelease,       To(S::kInspecting)},
    {S::kBackingOff,     Event::kTimer,   &LockMachine::StartCreate,       kCreateAgain},
    {S::kBackingOff,     Event::kRelease, &LockMachine::Cancel,            To(S::kFailed)},
    {S::kEntombing,      Event::kOk,      &LockMachine::StartCreate,       kCreateAgain},
    {S::kEntombing,      Event::kMissing, &LockMachine::StartCreate,       kCreateAgain},
    {S::kEntombing,      Event::kExists,  &LockMachine::Inspect,           To(S::kInspecting)},
    {S::kEntombing,      Event::kError,   &LockMachine::InspectFailed,     kBackOff},
    {S::kEntombing,      Event::kRelease, &LockMachine::NoteRelease,       To(S::kEntombing)},
    {S::kWithdrawing,    Event::kOk,      &LockMachine::Withdrawn,         kBackOff},
    {S::kWithdrawing,    Event::kMissing, &LockMachine::Withdrawn,         kBackOff},
    {S::kWithdrawing,    Event::kExists,  &LockMachine::Withdrawn,         kBackOff},
    {S::kWithdrawing,    Event::kError,   &LockMachine::Withdrawn,         kBackOff | To(S::kWithdrawing)},
    {S::kWithdrawing,    Event::kTimer,   &LockMachine::ResendBusy,        To(S::kWithdrawing)},
    {S::kWithdrawing,    Event::kRelease, &LockMachine::NoteRelease,       To(S::kWithdrawing)},
    // holding
    {S::kHeld,           Event::kTimer,   &LockMachine::Renew,             To(S::kRenewing, S::kLost)},
    {S::kHeld,           Event::kRelease, &LockMachine::StartRelease,      To(S::kReleaseInspect, S::kDropping, S::kLost)},
    {S::kRenewing,       Event::kOk,      &LockMachine::ConfirmRenewal,    To(S::kConfirming)},
    {S::kRenewing,       Event::kError,   &LockMachine::RenewalInconclusive, kBecomeHolder | To(S::kRenewing)},
    {S::kRenewing,       Event::kMissing, &LockMachine::LoseTable,         To(S::kLost)},
    {S::kRenewing,       Event::kExists,  &LockMachine::FailWithResponse,  To(S::kFailed)},
    {S::kRenewing,       Event::kRelease, &LockMachine::NoteRelease,       To(S::kRenewing)},
    {S::kRenewing,       Event::kTimer,   &LockMachine::ResendBusy,        To(S::kRenewing, S::kLost)},
    {S::kConfirming,     Event::kOk,      &LockMachine::Confirmed,         kBecomeHolder},
    {S::kConfirming,     Event::kMissing, &LockMachine::LoseTable,         To(S::kLost)},
    {S::kConfirming,     Event::kError,   &LockMachine::RenewalInconclusive, kBecomeHolder},
    {S::kConfirming,     Event::kExists,  &LockMachine::FailWithResponse,  To(S::kFailed)},
    {S::kConfirming,     Event::kRelease, &LockMachine::NoteRelease,       To(S::kConfirming)},
    {S::kConfirming,     Event::kTimer,   &LockMachine::Ignore,            To(S::kConfirming)},
    // releasing
    {S::kReleaseInspect, Event::kOk,      &LockMachine::CheckBeforeDrop,   To(S::kDropping, S::kReleased, S::kLost)},
    {S::kReleaseInspect, Event::kMissing, &LockMachine::ReleaseInspectMissing, To(S::kReleased, S::kLost)},
    {S::kReleaseInspect, Event::kError,   &LockMachine::RetryReleaseInspect, To(S::kReleaseInspect, S::kLost)},
    {S::kReleaseInspect, Event::kExists,  &LockMachine::ReleaseFailed,     To(S::kLost)},
    {S::kReleaseInspect, Event::kTimer,   &LockMachine::Ignore,            To(S::kReleaseInspect)},
    {S::kReleaseInspect, Event::kRelease, &LockMachine::Ignore,            To(S::kReleaseInspect)},
    {S::kDropping,       Event::kOk,      &LockMachine::Dropped,           To(S::kReleased)},
    {S::kDropping,       Event::kMissing, &LockMachine::Dropped,           To(S::kReleased)},
    {S::kDropping,       Event::kError,   &LockMachine::RetryDrop,         To(S::kReleaseInspect, S::kDropping, S::kLost)},
    {S::kDropping,       Event::kExists,  &LockMachine::ReleaseFailed,     To(S::kLost)},
    {S::kDropping,       Event::kTimer,   &LockMachine::ResendBusy,        To(S::kDropping, S::kLost)},
    {S::kDropping,       Event::kRelease, &LockMachine::Ignore,            To(S::kDropping)},
    // a renewal timer armed while held may still fire after the end
    {S::kReleased,       Event::kTimer,   &LockMachine::Ignore,            To(S::kReleased)},
    {S::kLost,           Event::kTimer,   &LockMachine::Ignore,            To(S::kLost)},
    {S::kFailed,         Event::kTimer,   &LockMachine::Ignore,            To(S::kFailed)},
    {S::kReleased,       Event::kRelease, &LockMachine::Ignore,            To(S::kReleased)},
};
// clang-format on

LockMachine::LockMachine(const Statements& statements, std::string state_id, LockOptions options)
    : st_(statements), state_id_(std::move(state_id)), options_(options) {}

void LockMachine::Acquire(const Inputs& in) { Dispatch(Event::kAcquire, nullptr, in); }
void LockMachine::Release(const Inputs& in) { Dispatch(Event::kRelease, nullptr, in); }
void LockMachine::OnTimer(const Inputs& in) { Dispatch(Event::kTimer, nullptr, in); }
void LockMachine::OnResponse(const SqlResponse& r, const Inputs& in) {
  if (r.transport_ok) unreachable_in_a_row_ = 0;
  Dispatch(Classify(r), &r, in);
}

std::optional<LockAction> LockMachine::Poll() {
  if (out_.empty()) return std::nullopt;
  LockAction a = std::move(out_.front());
  out_.pop_front();
  return a;
}

bool LockMachine::LeaseValid(int64_t now_ms) const {
  bool holding = state_ == LockState::kHeld || state_ == LockState::kRenewing || state_ == LockState::kConfirming;
  return holding && now_ms < lease_deadline_ms_;
}

void LockMachine::Dispatch(Event e, const SqlResponse* r, const Inputs& in) {
  // Responses only count in states that sent something; a response that
  // arrives when none is outstanding is a host bug.
  for (const Transition& t : kTable) {
    if (t.from == state_ && t.event == e) {
      (this->*t.handle)(r, in);
      if ((t.to & (1u << static_cast<int>(state_))) == 0) {
        // A handler went somewhere its row does not say: a bug here, never
        // the peer's doing. Stop acting under the lock.
        absl::Status bug = absl::InternalError(absl::StrCat("lock machine: event \"", EventName(e), "\" in state \"",
                                                            LockStateName(t.from), "\" led to \"",
                                                            LockStateName(state_), "\", which its row does not list"));
        if (state_ == LockState::kHeld || state_ == LockState::kRenewing || state_ == LockState::kConfirming) {
          Lose(bug);
        } else {
          Fail(bug);
        }
      }
      return;
    }
  }
  Misuse(e);
}

void LockMachine::Misuse(Event e) {
  bool was_holding = state_ == LockState::kHeld || state_ == LockState::kRenewing || state_ == LockState::kConfirming;
  absl::Status s = absl::FailedPreconditionError(absl::StrCat("lock misuse: event \"", EventName(e),
                                                              "\" in state \"", LockStateName(state_), "\""));
  if (was_holding) {
    Lose(s);
  } else {
    Fail(s);
  }
}

void LockMachine::Send(SqlRequest r, const Inputs&) {
  // A renewal row and the release's DROP (cluster: end row) act under the
  // lock: the task sends them, first or again, only within the lease.
  if (state_ == LockState::kRenewing || state_ == LockState::kDropping) r.send_before_ms = lease_deadline_ms_;
  outstanding_ = r;
  LockAction a{LockAction::Kind::kRunSql};
  a.request = std::move(r);
  out_.push_back(std::move(a));
}

void LockMachine::Fail(absl::Status s) {
  state_ = LockState::kFailed;
  out_.push_back(LockAction{LockAction::Kind::kFailed, {}, 0, std::move(s)});
}

void LockMachine::Lose(absl::Status s) {
  state_ = LockState::kLost;
  lease_deadline_ms_ = 0;
  out_.push_back(LockAction{LockAction::Kind::kLost, {}, 0, std::move(s)});
}

// ---- holding ----

void LockMachine::Renew(const SqlResponse*, const Inputs& in) {
  if (!LeaseValid(in.now_ms)) {
    Lose(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                         "\" expired: it could not be renewed within the stale window")));
    return;
  }
  state_ = LockState::kRenewing;
  renew_sent_at_ms_ = in.now_ms;
  busy_until_ms_ = lease_deadline_ms_;
  Send(Claims() ? st_.RenewClaim(state_id_, lock_id_, StaleSeconds()) : st_.RenewLock(state_id_, lock_id_, StaleSeconds()),
       in);
}

void LockMachine::ConfirmRenewal(const SqlResponse*, const Inputs& in) {
  // Only a renewal row known to have landed may extend the lease: one whose
  // answer was lost might never have arrived (then RenewalInconclusive).
  state_ = LockState::kConfirming;
  Send(InspectRequest(), in);
}

void LockMachine::Confirmed(const SqlResponse* r, const Inputs& in) {
  absl::StatusOr<LockInspection> insp =
      Claims() ? ParseClaimInspection(r->body, lock_id_, StaleSeconds()) : ParseLockInspection(r->body);
  // Cluster mode: ours while our claim stands and no claim took it over (a
  // live claim of a racer that has yet to see ours and withdraw is no loss).
  const bool ours = Claims() ? insp.ok() && insp->ours_held : insp.ok() && insp->exists && insp->holder == lock_id_;
  if (!ours && !defects_.renewal_accepts_any_holder) {
    Lose(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                         "\" was taken over by another process while held")));
    return;
  }
  if (!LeaseValid(in.now_ms) && !defects_.revive_expired_lease) {
    // The lease ran out while the renewal was in flight: from then on a taker
    // may have judged the lock stale and acted (a renewal row that landed
    // late, beyond the margin, cannot undo that). Never revive it.
    Lose(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                         "\" ran out while its renewal was in flight")));
    return;
  }
  lease_deadline_ms_ = std::max(lease_deadline_ms_, renew_sent_at_ms_ + options_.stale_ms - MarginMs());
  state_ = LockState::kHeld;
  if (release_requested_) {
    StartRelease(nullptr, in);
    return;
  }
  out_.push_back(LockAction{LockAction::Kind::kArmTimer, {}, options_.stale_ms / 3});
}

void LockMachine::RenewalInconclusive(const SqlResponse* r, const Inputs& in) {
  if (state_ == LockState::kRenewing && RetryBusy(r, in)) return;
  if (!LeaseValid(in.now_ms)) {
    // Not sent again past the lease (the task saw to it): another process
    // may hold the lock by now.
    LeaseRanOut(Cause(r, "renewing the lock"), in);
    return;
  }
  // The lease stands as it was; try again soon.
  state_ = LockState::kHeld;
  if (release_requested_) {
    StartRelease(nullptr, in);
    return;
  }
  out_.push_back(LockAction{LockAction::Kind::kArmTimer, {}, std::min(options_.retry_ms, options_.stale_ms / 10)});
}

void LockMachine::LoseTable(const SqlResponse*, const Inputs&) {
  Lose(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                       "\" is gone: it was taken over as stale while held")));
}

// ---- releasing ----

void LockMachine::StartRelease(const SqlResponse*, const Inputs& in) {
  release_requested_ = false;
  if (!LeaseValid(in.now_ms)) {
    // Past the lease another process may hold the lock: dropping could remove
    // theirs. Leave ours to expire.
    Lose(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                         "\" was held past its lease; it was left to expire instead of being "
                                         "dropped. Keep holds shorter than the stale window or let renewals run")));
    return;
  }
  if (Claims()) {
    // The end row: only our own claim's, so it cannot touch another's lock.
    state_ = LockState::kDropping;
    busy_until_ms_ = lease_deadline_ms_;
    Send(st_.EndClaim(state_id_, lock_id_), in);
    return;
  }
  state_ = LockState::kReleaseInspect;
  Send(st_.InspectLock(state_id_), in);
}

void LockMachine::CheckBeforeDrop(const SqlResponse* r, const Inputs& in) {
  absl::StatusOr<LockInspection> insp = ParseLockInspection(r->body);
  if (insp.ok() && drop_uncertain_ && (!insp->exists || insp->holder != lock_id_)) {
    Dropped(r, in);  // our earlier DROP landed; the lock there now is someone else's
    return;
  }
  if (!insp.ok() || !insp->exists || insp->holder != lock_id_) {
    Lose(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                         "\" was no longer ours at release: it was taken over while held")));
    return;
  }
  if (in.now_ms >= lease_deadline_ms_) {
    Lose(absl::AbortedError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                         "\" ran past its lease during release; it was left to expire instead of "
                                         "being dropped")));
    return;
  }
  state_ = LockState::kDropping;
  Send(st_.DropLock(state_id_), in);
}

void LockMachine::RetryReleaseInspect(const SqlResponse* r, const Inputs& in) {
  // An inconclusive look before the DROP is worth repeating while the lease
  // lasts: giving up leaves the lock in place for a whole stale window.
  if (release_retries_ < 3 && in.now_ms < lease_deadline_ms_) {
    ++release_retries_;
    Send(st_.InspectLock(state_id_), in);
    return;
  }
  ReleaseFailed(r, in);
}

void LockMachine::RetryDrop(const SqlResponse* r, const Inputs& in) {
  if (Claims() && RetryBusy(r, in)) return;
  if (in.now_ms >= lease_deadline_ms_) {
    // Not sent again past the lease (the task saw to it): landing after a
    // takeover, a DROP would remove the new holder's lock.
    LeaseRanOut(Cause(r, "releasing the lock"), in);
    return;
  }
  if (Claims()) {
    ReleaseFailed(r, in);  // the core already resent it after transport failures (idempotent)
    return;
  }
  // Never resend the DROP blindly: if the first one landed, another process
  // may have created a fresh lock under the same name since. Look first; the
  // lock is dropped again only if it is still ours.
  if (r && !r->transport_ok && release_retries_ < 3 && in.now_ms < lease_deadline_ms_) {
    ++release_retries_;
    drop_uncertain_ = true;
    state_ = LockState::kReleaseInspect;
    Send(st_.InspectLock(state_id_), in);
    return;
  }
  ReleaseFailed(r, in);
}

void LockMachine::ReleaseInspectMissing(const SqlResponse* r, const Inputs& in) {
  if (drop_uncertain_) {
    Dropped(r, in);  // our earlier DROP landed
    return;
  }
  LoseTable(r, in);
}

std::string LockMachine::Cause(const SqlResponse* r, absl::string_view what) {
  if (r == nullptr) return "no answer";
  const std::optional<int> code = ResponseCode(*r);
  if (code == ch::kUnsatisfiedQuorumForPreviousWrite) return kBusyCause;
  absl::Status st = CheckResponse(*r, what);
  return st.ok() ? std::string("an unexpected answer") : std::string(st.message());
}

void LockMachine::LeaseRanOut(const std::string& cause, const Inputs&) {
  const bool dropping = state_ == LockState::kDropping;
  const char* request = !dropping ? "its renewal" : Claims() ? "its release's end row" : "its release's DROP";
  Lose(absl::AbortedError(absl::StrCat(
      "the lock on state id \"", PrintableId(state_id_), "\" ran out while ", request, " waited out ", cause,
      ": it was not sent again past the lease, since another process may hold the lock by now. ",
      dropping ? "It was left to expire" : "Stop acting under it and release it")));
}

void LockMachine::Dropped(const SqlResponse*, const Inputs&) {
  state_ = LockState::kReleased;
  lease_deadline_ms_ = 0;
  out_.push_back(LockAction{LockAction::Kind::kReleased});
}

void LockMachine::ReleaseFailed(const SqlResponse* r, const Inputs&) {
  absl::Status s = r ? CheckResponse(*r, "releasing the lock") : absl::UnknownError("release failed");
  if (s.ok()) s = absl::InternalError("unexpected answer releasing the lock");
  Lose(absl::Status(s.code(), absl::StrCat(s.message(), ". The lock on state id \"", PrintableId(state_id_),
                                           "\" was not released; it expires after ", options_.stale_ms / 1000,
                                           " s")));
}

void LockMachine::FailWithResponse(const SqlResponse* r, const Inputs&) {
  absl::Status s = r ? CheckResponse(*r, "taking the lock") : absl::UnknownError("lock request failed");
  if (s.ok()) s = absl::InternalError("unexpected answer while taking the lock");
  Fail(std::move(s));
}

}  // namespace chstate
