// The lock machine acquiring: creating the lock table (or, in cluster mode,
// starting a claim), inspecting a lock that exists, deciding from the
// inspection, backing off and giving up. The cluster claims' own steps are
// in lock_claims.cc.
#include "core/lock_machine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/clickhouse_errors.h"
#include "core/quoting.h"
#include "core/response.h"

namespace chstate {

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

}  // namespace chstate
