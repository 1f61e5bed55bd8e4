// The lock's transition table and its handlers. Every (state, event) pair
// the machine accepts is one row of kTable; any other pair is misuse and
// ends in kFailed.
#include "core/lock_machine.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
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

std::string LockInstance(const LockInspection& inspection) {
  return inspection.holder.empty() ? absl::StrCat("empty@", inspection.table_created_s)
                                   : absl::StrCat("holder:", inspection.holder);
}

absl::StatusOr<LockInspection> ParseLockInspection(const std::string& body) {
  absl::StatusOr<Rows> rows = ParseTabSeparated(body, 5);
  if (!rows.ok()) return rows.status();
  LockInspection out;
  int64_t now = 0, table_time = 0, newest = -1, created = -1;
  bool have_table_row = false;
  struct Parsed {
    std::string id;
    int64_t seq, at, stale_s;
  };
  std::vector<Parsed> lock_rows;
  for (const Row& row : *rows) {
    int64_t seq = 0, at = 0, row_now = 0, stale_s = 0;
    if (!row[0] || !row[1] || !row[2] || !row[3] || !row[4] || !absl::SimpleAtoi(*row[1], &seq) ||
        !absl::SimpleAtoi(*row[2], &at) || !absl::SimpleAtoi(*row[3], &row_now) ||
        !absl::SimpleAtoi(*row[4], &stale_s)) {
      return absl::DataLossError("unexpected answer inspecting a lock");
    }
    now = std::max(now, row_now);
    if (seq == 255) {
      have_table_row = true;
      table_time = at;
    } else {
      lock_rows.push_back({*row[0], seq, at, stale_s});
    }
  }
  if (!have_table_row) return out;  // no such table: no lock
  out.exists = true;
  for (const Parsed& p : lock_rows) {
    if (p.seq == 0) {
      out.holder = p.id;
      created = p.at;
      out.stale_s = p.stale_s;
    }
  }
  if (created >= 0) {
    for (const Parsed& p : lock_rows) {
      if (p.id == out.holder) newest = std::max(newest, p.at);
    }
  } else {
    newest = table_time;  // creation row not visible yet
  }
  out.age_s = now - newest;
  out.created_s = created >= 0 ? created : table_time;
  out.table_created_s = table_time;
  out.now_s = now;
  return out;
}

absl::StatusOr<LockInspection> ParseClaimInspection(const std::string& body, const std::string& ours,
                                                    int64_t stale_s, const std::string& own_prefix) {
  absl::StatusOr<Rows> rows = ParseTabSeparated(body, 7);
  if (!rows.ok()) return rows.status();
  struct Claim {
    std::string id;
    int64_t newest = 0, stale_s = 0;
    bool live = false;
  };
  LockInspection out;
  std::vector<Claim> others;
  bool ours_visible = false, ours_ended = false, taken_over = false;
  // A claim another claim took over (named in its `over`) was judged stale
  // by the taker, under a window no shorter than its own: its lease is over,
  // whoever reads it now.
  std::set<std::string> taken;
  for (const Row& row : *rows) {
    if (row.size() == 7 && row[5]) {
      for (absl::string_view id : absl::StrSplit(*row[5], ',', absl::SkipEmpty())) taken.emplace(id);
    }
  }
  for (const Row& row : *rows) {
    int64_t claims = 0, ends = 0, newest = 0, row_stale = 0, now = 0;
    if (row.size() != 7 || !row[0] || !row[1] || !row[2] || !row[3] || !row[4] || !row[5] || !row[6] ||
        !absl::SimpleAtoi(*row[1], &claims) || !absl::SimpleAtoi(*row[2], &ends) ||
        !absl::SimpleAtoi(*row[3], &newest) || !absl::SimpleAtoi(*row[4], &row_stale) ||
        !absl::SimpleAtoi(*row[6], &now)) {
      return absl::DataLossError("unexpected answer inspecting the lock's claims");
    }
    out.now_s = std::max(out.now_s, now);
    for (absl::string_view taken : absl::StrSplit(*row[5], ',', absl::SkipEmpty())) {
      if (!ours.empty() && taken == ours) taken_over = true;
    }
    if (*row[0] == ours) {
      ours_visible = claims > 0;
      ours_ended = ends > 0;
      continue;
    }
    // Prunable: its holder's lease is over by its own window (the end row is
    // written within the lease; a taker judged it stale; or it is), or it
    // is rows of a claim that never showed, long ago. A claim judged live
    // by a reader with a longer window is no less over.
    const bool judged_over = ends > 0 || taken.count(*row[0]) || now - newest > row_stale + kClaimPruneSlackS;
    if (claims > 0 ? judged_over : now - newest > kClaimOrphanS) out.dead.push_back(*row[0]);
    // An earlier claim of this very acquisition (ended, its end row maybe not
    // yet visible): never another process's.
    if (!own_prefix.empty() && absl::StartsWith(*row[0], own_prefix)) continue;
    if (claims == 0 || ends > 0 || taken.count(*row[0])) continue;  // ended, taken over, or not visible yet
    // A claim is judged by the larger of the two windows, as a held table is.
    const int64_t window_s = std::max(stale_s, row_stale);
    others.push_back(Claim{*row[0], newest, row_stale, (now - newest) <= window_s});
  }
  out.ours_held = ours_visible && !ours_ended && !taken_over;
  std::vector<std::string> over;
  const Claim* pick = nullptr;
  for (const Claim& c : others) {
    over.push_back(c.id);
    const bool better = pick == nullptr || (c.live && !pick->live) ||
                        (c.live == pick->live && c.newest > pick->newest);
    if (better) pick = &c;
  }
  out.over = absl::StrJoin(over, ",");
  if (pick != nullptr && pick->live) {
    out.exists = true;
    out.holder = pick->id;
    out.age_s = out.now_s - pick->newest;
    out.stale_s = pick->stale_s;
  } else if (out.ours_held) {
    out.exists = true;
    out.holder = ours;
    out.stale_s = stale_s;
  } else if (pick != nullptr) {
    out.exists = true;
    out.holder = pick->id;
    out.age_s = out.now_s - pick->newest;
    out.stale_s = pick->stale_s;
  }
  out.created_s = out.table_created_s = 0;
  return out;
}

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

// ---- acquiring ----

void LockMachine::StartCreate(const SqlResponse*, const Inputs& in) {
  if (state_ == LockState::kIdle) {
    if (in.random.size() < 16) {
      Fail(absl::InvalidArgumentError("the host passed fewer than 16 random bytes for a lock id"));
      return;
    }
    lock_id_ = MakeLockId(in.random);
    start_ms_ = in.now_ms;
    deadline_ms_ = in.now_ms + options_.timeout_ms;
  }
  if (release_requested_) {
    Cancel(nullptr, in);
    return;
  }
  if (Claims()) {
    Inspect(nullptr, in);  // claims are read before one is written
    return;
  }
  state_ = LockState::kCreating;
  create_sent_at_ms_ = in.now_ms;
  Send(st_.CreateLock(state_id_, lock_id_, StaleSeconds()), in);
}

void LockMachine::CreateSchema(const SqlResponse* r, const Inputs& in) {
  if (schema_made_) {
    FailWithResponse(r, in);
    return;
  }
  schema_made_ = true;
  state_ = LockState::kCreatingSchema;
  claimed_ = false;  // the table was missing: no claim was written
  if (Claims()) {
    // The claims table (and its database) ON CLUSTER; IF NOT EXISTS, so a
    // creator that lost the race is as good as one that won.
    Send(ResponseCode(*r) == kCodeUnknownDatabase ? st_.CreateDatabase() : st_.CreateClaimsTable(), in);
    schema_made_ = ResponseCode(*r) != kCodeUnknownDatabase;
    return;
  }
  Send(st_.CreateDatabase(), in);
}

void LockMachine::SchemaMaybeMade(const SqlResponse* r, const Inputs& in) {
  // Cluster mode: an ON CLUSTER CREATE ... IF NOT EXISTS that some host did
  // not run in time (159) ran on the others; the next claim shows whether
  // enough replicas have the table.
  if (Claims() && r && ResponseCode(*r) == ch::kTimeoutExceeded) {
    StartCreate(nullptr, in);
    return;
  }
  FailWithResponse(r, in);
}

void LockMachine::CreateUncertain(const SqlResponse* r, const Inputs& in) {
  if (Claims()) {
    if (RetryBusy(r, in)) return;
    std::optional<int> code = r ? ResponseCode(*r) : std::nullopt;  // none without an answer
    if (code) NoteQuorumTrouble(*r);
    if (code == ch::kTooFewLiveReplicas || code == ch::kUnsatisfiedQuorumForPreviousWrite) {
      claimed_ = false;  // refused before anything was written
      BackOff(in);  // at the deadline it reports the quorum's trouble
      return;
    }
    if (r && r->transport_ok && code != ch::kUnknownStatusOfInsert) {
      FailWithResponse(r, in);
      return;
    }
    // No answer, or code 319 (the quorum not confirmed in time): the claim
    // may be in, or may land later. The next read settles it; if it is not
    // ours by then it is ended before anything else.
    if (r && !r->transport_ok) {
      quorum_trouble_ = absl::UnavailableError(absl::StrCat(
          "the lock on state id \"", PrintableId(state_id_), "\" could not be taken: its claim got no answer (",
          r->transport_error, "); replicas may be down or hung. If the claim landed, it blocks the id for ",
          options_.stale_ms / 1000, " s at most"));
      saw_live_claim_ = false;
    }
    if (!create_unresolved_) earliest_unresolved_create_ms_ = create_sent_at_ms_;
    create_unresolved_ = true;
    if (r && !r->transport_ok && GiveUpUnreachable(*r)) return;
    Inspect(nullptr, in);
    return;
  }
  // Code 159 on an ON CLUSTER CREATE (cluster mode): some host did not run it
  // within the DDL timeout; it ran on the others and stays queued for that
  // one. Like a lost answer, it may be ours.
  if (r && r->transport_ok && ResponseCode(*r) != ch::kTimeoutExceeded) {
    FailWithResponse(r, in);
    return;
  }
  // No answer: the CREATE may have landed. Inspecting settles it. Should it
  // turn out ours, the lease counts from the earliest CREATE that may have
  // landed, since the server stamped that one no earlier than it was sent.
  if (!create_unresolved_) earliest_unresolved_create_ms_ = create_sent_at_ms_;
  create_unresolved_ = true;
  if (r && GiveUpUnreachable(*r)) return;
  Inspect(nullptr, in);
}

bool LockMachine::GiveUpUnreachable(const SqlResponse& r) {
  // The executor has already retried what it may; several requests in a row
  // without any answer mean the server is down, not that the lock is busy.
  unreachable_ = CheckResponse(r, "taking the lock");
  if (unreachable_.ok()) unreachable_ = absl::UnavailableError("no answer from ClickHouse");
  if (++unreachable_in_a_row_ < kUnreachableLimit) return false;
  FailUnreachable();
  return true;
}

void LockMachine::FailUnreachable() {
  std::string note = create_unresolved_
                         ? absl::StrCat("; if a CREATE of ours landed unseen, that lock expires after ",
                                        options_.stale_ms / 1000, " s")
                         : std::string();
  Fail(absl::Status(unreachable_.code(),
                    absl::StrCat(unreachable_.message(), " (", unreachable_in_a_row_,
                                 " lock requests in a row got no answer; the lock was not taken", note, ")")));
}

void LockMachine::Inspect(const SqlResponse*, const Inputs& in) {
  state_ = LockState::kInspecting;
  Send(InspectRequest(), in);
}

SqlRequest LockMachine::InspectRequest() const {
  return Claims() ? st_.InspectClaims(state_id_) : st_.InspectLock(state_id_);
}

int64_t LockMachine::Jitter(const Inputs& in, int64_t base_ms) const {
  // base/2 .. 3*base/2, from the host's random bytes.
  uint64_t r = 0;
  for (size_t i = 0; i < in.random.size() && i < 8; ++i) r = (r << 8) | static_cast<unsigned char>(in.random[i]);
  return base_ms / 2 + static_cast<int64_t>(r % static_cast<uint64_t>(std::max<int64_t>(base_ms, 1)));
}

void LockMachine::Claim(const std::string& over, const Inputs& in) {
  if (in.random.size() < 16) {
    Fail(absl::InvalidArgumentError("the host passed fewer than 16 random bytes for a lock id"));
    return;
  }
  // A fresh id per claim (an ended claim stays ended): this acquisition's
  // random prefix and the claim's number, so that its earlier claims, should
  // they land late, are known as its own and never taken for another's.
  if (claim_prefix_.empty()) claim_prefix_ = MakeLockId(in.random).substr(0, kClaimPrefixLen);
  lock_id_ = absl::StrCat(claim_prefix_, absl::Hex(++claims_made_, absl::kZeroPad8));
  claimed_ = true;
  create_unresolved_ = false;
  state_ = LockState::kCreating;
  create_sent_at_ms_ = in.now_ms;
  busy_until_ms_ = in.now_ms + st_.cluster().quorum_busy_ms;
  Send(st_.ClaimLock(state_id_, lock_id_, StaleSeconds(), over), in);
}

bool LockMachine::RetryBusy(const SqlResponse* r, const Inputs& in) {
  if (!Claims() || r == nullptr || !r->transport_ok) return false;
  // 286 wrote nothing; 319 may have written an end row, which is harmless
  // to write again (end rows only; a claim or renewal is settled by reading).
  const std::optional<int> code = ResponseCode(*r);
  const bool end_row = outstanding_.purpose == "end_claim";
  const bool again = code == ch::kUnsatisfiedQuorumForPreviousWrite || code == ch::kTooManyParts ||
                     (end_row && (code == ch::kUnknownStatusOfInsert || code == ch::kTooFewLiveReplicas));
  if (!again) return false;
  if (in.now_ms >= busy_until_ms_ || outstanding_.sql.empty()) return false;
  busy_resend_ = outstanding_;
  out_.push_back(LockAction{LockAction::Kind::kArmTimer, {}, Jitter(in, 60)});
  return true;
}

void LockMachine::ResendBusy(const SqlResponse*, const Inputs& in) {
  if (!busy_resend_) return;  // a renewal timer from before: nothing to do
  SqlRequest again = *std::move(busy_resend_);
  busy_resend_.reset();
  // Acts under the lock go out only within the lease, also when sent again.
  if ((state_ == LockState::kRenewing && !LeaseValid(in.now_ms)) ||
      (state_ == LockState::kDropping && in.now_ms >= lease_deadline_ms_)) {
    LeaseRanOut(kBusyCause, in);
    return;
  }
  if (state_ == LockState::kCreating) create_sent_at_ms_ = in.now_ms;
  if (state_ == LockState::kRenewing) renew_sent_at_ms_ = in.now_ms;
  Send(std::move(again), in);
}

void LockMachine::WithdrawThenBackOff(const Inputs& in, bool short_wait) {
  withdraw_short_ = short_wait;
  if (!claimed_) {
    BackOff(in);
    return;
  }
  state_ = LockState::kWithdrawing;
  busy_until_ms_ = in.now_ms + st_.cluster().quorum_busy_ms;
  Send(st_.EndClaim(state_id_, lock_id_), in);
}

void LockMachine::Withdrawn(const SqlResponse* r, const Inputs& in) {
  if (RetryBusy(r, in)) return;
  if (r && r->transport_ok) NoteQuorumTrouble(*r);
  // Ended (or, if the end row failed, left to go stale: it never held).
  claimed_ = false;
  if (release_requested_) {
    Cancel(nullptr, in);
    return;
  }
  BackOff(in);
}

void LockMachine::NoteQuorumTrouble(const SqlResponse& r) {
  const absl::Status st = CheckResponse(r, "taking the lock");
  const std::optional<int> code = ClickHouseCode(st);
  if (code != ch::kTooFewLiveReplicas && code != ch::kUnsatisfiedQuorumForPreviousWrite &&
      code != ch::kUnknownStatusOfInsert) {
    return;
  }
  const std::string fewer = absl::StrCat("fewer than ", st_.cluster().quorum,
                                         " replicas are alive (code 285); nothing was written");
  const char* why = code == ch::kTooFewLiveReplicas
                        ? fewer.c_str()
                    : code == ch::kUnsatisfiedQuorumForPreviousWrite
                        ? "an earlier write to the lock's claims has not reached its quorum (code 286: a replica that "
                          "holds it is down or lagging)"
                        : "a claim's quorum was not confirmed in time (code 319: a replica is down or hung)";
  quorum_trouble_ = absl::UnavailableError(absl::StrCat("the lock on state id \"", PrintableId(state_id_),
                                                        "\" could not be taken: ", why,
                                                        ". Retry when the replicas are back. ClickHouse said: ",
                                                        st.message()));
  saw_live_claim_ = false;
}

void LockMachine::DecideClaims(const LockInspection& insp, const Inputs& in) {
  if (claimed_ && insp.ours_held && insp.holder == lock_id_) {
    BecomeHolder(create_unresolved_ ? earliest_unresolved_create_ms_ : create_sent_at_ms_, in);
    return;
  }
  if (release_requested_) {
    WithdrawThenBackOff(in, true);  // Withdrawn cancels
    return;
  }
  if (!insp.exists || insp.holder == lock_id_) {
    // Free. Ours, if written, is not visible (its answer was lost, or a
    // lagging replica): end it first, then claim afresh.
    if (claimed_) {
      WithdrawThenBackOff(in, true);
      return;
    }
    Claim("", in);
    return;
  }
  LockOptions judged = options_;
  if (!defects_.ignore_holder_window) judged.stale_ms = std::max(options_.stale_ms, insp.stale_s * 1000);
  switch (DecideOnHeldLock(true, insp.age_s, in.now_ms, deadline_ms_, judged)) {
    case LockVerdict::kRetryNow:
    case LockVerdict::kTakeOver:
      if (claimed_) {
        WithdrawThenBackOff(in, true);
        return;
      }
      Claim(insp.over, in);
      return;
    case LockVerdict::kWait:
    case LockVerdict::kGiveUp:  // BackOff fails it, after our claim is ended
      saw_live_claim_ = true;
      WithdrawThenBackOff(in, false);
      return;
  }
}

void LockMachine::NoteRelease(const SqlResponse*, const Inputs&) { release_requested_ = true; }

void LockMachine::Ignore(const SqlResponse*, const Inputs&) {}

void LockMachine::OnCreated(const SqlResponse*, const Inputs& in) {
  if (Claims() && !defects_.claim_without_second_read) {
    Inspect(nullptr, in);  // written: now see whether another claim is live
    return;
  }
  BecomeHolder(create_sent_at_ms_, in);
}

void LockMachine::BecomeHolder(int64_t sent_at_ms, const Inputs& in) {
  create_unresolved_ = false;
  state_ = LockState::kHeld;
  acquired_at_ms_ = in.now_ms;
  lease_deadline_ms_ = sent_at_ms + options_.stale_ms - MarginMs();
  out_.push_back(LockAction{LockAction::Kind::kAcquired});
  if (release_requested_) {
    StartRelease(nullptr, in);
    return;
  }
  out_.push_back(LockAction{LockAction::Kind::kArmTimer, {}, options_.stale_ms / 3});
}

void LockMachine::NoLock(const SqlResponse*, const Inputs& in) {
  if (Claims()) {
    // No claims table yet: the claim meets code 60 and creates it.
    if (claimed_) {
      WithdrawThenBackOff(in, true);
      return;
    }
    Claim("", in);
    return;
  }
  create_unresolved_ = false;  // no table at all: our CREATE did not land (or was long taken over)
  if (quick_retries_ < 3) {
    ++quick_retries_;
    StartCreate(nullptr, in);
    return;
  }
  BackOff(in);
}

void LockMachine::InspectFailed(const SqlResponse* r, const Inputs& in) {
  if (r && r->transport_ok) {
    if (Claims() && ResponseCode(*r) == ch::kReplicaIsNotInQuorum) {
      WithdrawThenBackOff(in, true);  // a replica behind the quorum: ask again shortly
      return;
    }
    if (Claims() && claimed_) {
      // End our claim before giving up, so that it blocks no one.
      fail_after_withdraw_ = CheckResponse(*r, "taking the lock");
      WithdrawThenBackOff(in, true);
      return;
    }
    FailWithResponse(r, in);
    return;
  }
  if (r && GiveUpUnreachable(*r)) return;
  WithdrawThenBackOff(in, true);
}

void LockMachine::Decide(const SqlResponse* r, const Inputs& in) {
  absl::StatusOr<LockInspection> insp =
      Claims() ? ParseClaimInspection(r->body, claimed_ ? lock_id_ : std::string(), StaleSeconds(), claim_prefix_)
               : ParseLockInspection(r->body);
  if (!insp.ok()) {
    Fail(insp.status());
    return;
  }
  if (Claims()) {
    DecideClaims(*insp, in);
    return;
  }
  if (!insp->exists) {
    NoLock(nullptr, in);
    return;
  }
  if (insp->holder == lock_id_) {
    // A CREATE of ours landed though its answer was lost.
    BecomeHolder(create_unresolved_ ? earliest_unresolved_create_ms_ : create_sent_at_ms_, in);
    return;
  }
  // Another holder, or none visible yet: ours may still be the one whose
  // creation row is not visible, so only a known other holder settles it.
  if (!insp->holder.empty()) create_unresolved_ = false;
  if (release_requested_) {
    Cancel(nullptr, in);
    return;
  }
  // The holder's lease was computed from its own window: never judge it by a
  // shorter one.
  LockOptions judged = options_;
  if (!defects_.ignore_holder_window) judged.stale_ms = std::max(options_.stale_ms, insp->stale_s * 1000);
  if (insp->holder.empty()) judged.stale_ms *= 2;
  switch (DecideOnHeldLock(true, insp->age_s, in.now_ms, deadline_ms_, judged)) {
    case LockVerdict::kRetryNow:  // unreachable: exists is true
    case LockVerdict::kTakeOver:
      state_ = LockState::kEntombing;
      // Named after the holder's random id, unique to this lock instance. A
      // table whose creation row is not visible is named by its creation
      // time, and only taken over after twice the window (below), long after
      // any row of a live CREATE would have become visible.
      Send(st_.EntombLock(state_id_, LockInstance(*insp)), in);
      return;
    case LockVerdict::kWait:
      BackOff(in);
      return;
    case LockVerdict::kGiveUp:
      Fail(absl::AbortedError(absl::StrCat(
          "state id \"", PrintableId(state_id_), "\" is locked by another process (its lock was last renewed ",
          insp->age_s, " s ago); gave up after ", (in.now_ms - start_ms_) / 1000.0,
          " s. Retry later or raise the lock timeout; a dead holder's lock is taken over after ",
          options_.stale_ms / 1000, " s")));
      return;
  }
}

void LockMachine::BackOff(const Inputs& in) {
  quick_retries_ = 0;
  if (!fail_after_withdraw_.ok()) {
    Fail(fail_after_withdraw_);
    return;
  }
  if (in.now_ms >= deadline_ms_ && unreachable_in_a_row_ > 0) {
    FailUnreachable();  // time is up and the last request got no answer: not a busy lock
    return;
  }
  if (in.now_ms >= deadline_ms_ && !quorum_trouble_.ok() && !saw_live_claim_) {
    Fail(quorum_trouble_);  // the replicas, not another process, kept the lock from us
    return;
  }
  if (in.now_ms >= deadline_ms_) {
    Fail(absl::AbortedError(absl::StrCat("state id \"", PrintableId(state_id_),
                                         "\" is locked by another process; gave up after ",
                                         (in.now_ms - start_ms_) / 1000.0, " s. Retry later or raise the lock timeout")));
    return;
  }
  state_ = LockState::kBackingOff;
  int64_t wait = std::min(options_.retry_ms, deadline_ms_ - in.now_ms);
  if (Claims()) {
    // Two claimants that saw each other both back off: the jitter breaks the
    // tie. One whose own claim was not visible yet comes back soon.
    wait = std::min(withdraw_short_ ? Jitter(in, 100) : Jitter(in, options_.retry_ms), deadline_ms_ - in.now_ms);
    withdraw_short_ = false;
  }
  out_.push_back(LockAction{LockAction::Kind::kArmTimer, {}, wait});
}

void LockMachine::Cancel(const SqlResponse*, const Inputs&) {
  Fail(absl::CancelledError(absl::StrCat("gave up waiting for the lock on state id \"", PrintableId(state_id_),
                                         "\": released before it was acquired")));
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
