// What the two lock machines share (core/table_lock.h, core/claims_lock.h):
// the lease margin and stale window in seconds, the back-off jitter, what an
// inspection of a lock shows (and its parsers, in lock_inspection.cc), the
// count of lock requests in a row without any answer, and the wording of the
// outcomes both report. Internal to the core's lock (the store and tests
// reach it through core/lock_machine.h).
//
//   LockInspection seen = *ParseLockInspection(answer.body);
//   int64_t lease_end = sent_at_ms + options.stale_ms - LeaseMarginMs(options);
#ifndef CHSTATE_CORE_LOCK_COMMON_H_
#define CHSTATE_CORE_LOCK_COMMON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/lock.h"
#include "core/sql_request.h"

namespace chstate {

// ---- the lease ----

// Safety margin subtracted from the lease (drift, request delay, and the
// server's whole-second timestamps).
int64_t LeaseMarginMs(const LockOptions& options);

// The stale window in whole seconds, rounded up: what a lock row records
// and the server compares ages with.
int64_t StaleWindowSeconds(const LockOptions& options);

// base/2 .. 3*base/2, from the host's random bytes (the first 8).
int64_t Jitter(absl::string_view random, int64_t base_ms);

// ---- inspections ----

// What a lock table read (or, in cluster mode, a claims read) says.
struct LockInspection {
  bool exists = false;
  std::string holder;  // "" while the creation row is not visible yet
  int64_t age_s = 0;   // of the holder's newest row (or of the table if no holder yet)
  int64_t created_s = 0;  // server time of the creation row (or of the table): names the instance
  int64_t stale_s = 0;    // the holder's stale window, from its creation row (0: unknown)
  int64_t table_created_s = 0;  // the table's creation time: names the instance for takers
  int64_t now_s = 0;            // the server's clock when it answered
  // Cluster mode (claims): our claim is visible, not ended, and no claim
  // names it as taken over.
  bool ours_held = false;
  // Cluster mode: the lock ids of every claim not ended but our own (all
  // stale when holder is not live): what a claim made now takes over.
  std::string over;
  // Cluster mode: claims (not ours) no reader counts any more, whose rows
  // may be removed (Statements::PruneClaims): ended, taken over by another
  // claim, or stale by their own window (so their holder's lease is over,
  // whoever reads); and rows of a claim never seen, older than a day.
  std::vector<std::string> dead;
};
// What names a lock instance's tombstone (Statements::EntombLock): the
// holder's random id, or the table's creation time while no creation row is
// visible.
std::string LockInstance(const LockInspection& inspection);
// Decodes the 5-column answer of Statements::InspectLock.
absl::StatusOr<LockInspection> ParseLockInspection(const std::string& body);
// Decodes the answer of Statements::InspectClaims for the claimant `ours`
// whose stale window is `stale_s`: exists when a claim of another process
// has not ended; holder is `ours` when ours is visible and no other live
// claim is, else the other live claim with the newest row, else the stale
// one with the newest row.
// Claims whose id starts with `own_prefix` (the claimant's earlier claims in
// the same acquisition) are left out.
// The answer may join the answers of several replicas (part::ReadClaims):
// a claim is what any of them shows of it (its rows on one replica, its end
// row on another), and the rows naming the replicas are left out.
absl::StatusOr<LockInspection> ParseClaimInspection(const std::string& body, const std::string& ours,
                                                    int64_t stale_s, const std::string& own_prefix = "");

// The replica that gave an answer of Statements::InspectClaims (its last
// row, kClaimsReplicaRow), and how many replicas the claims table has.
struct ClaimsReplica {
  std::string name;
  int64_t replicas = 0;
};
// nullopt when the answer has no such row (a server without system.replicas
// rows for the table: nothing to say how many replicas to ask).
std::optional<ClaimsReplica> ClaimsReadReplica(const std::string& body);
// How many replicas a claims read must reach so that one of them has every
// claim confirmed by `quorum` of `replicas` (at least 1).
int64_t ClaimsReplicasToRead(int64_t replicas, int quorum);

// What the answer a lock machine was given last showed, parsed once (by the
// machine, as it arrives): kept for the machine's decisions and for its
// driver (the store prunes the claims a winning read found dead).
struct LockSighting {
  // The answer was a read of the lock (or of its claims) that parsed.
  bool inspected = false;
  LockInspection inspection;
  absl::Status garbled;  // a read that did not parse: why
  // Another process holding the lock, as the answer showed it (empty when
  // none, or when the answer was no read): the holder a waiter row names.
  // Table lock: the holder of a lock not ours; claims: another's live claim.
  std::string live_holder;
};

// ---- answers ----

// The four kinds of answer a lock request gets: success, code 57 (the table
// exists), a table or database that is missing (60, 81, or 218: a lock table
// being dropped by its releasing holder is as good as gone), or any other
// error, an answer that never came included.
enum class LockAnswer { kOk, kExists, kMissing, kError };
LockAnswer AnswerOf(const SqlResponse& r);
const char* LockAnswerName(LockAnswer a);

// ---- requests without any answer ----

// Lock requests in a row that got no answer at all. The executor has
// already retried what it may; kLimit of them in a row mean the server is
// down, not that the lock is busy.
class NoAnswerCount {
 public:
  static constexpr int kLimit = 3;
  // An answer came (any HTTP answer): the row is broken.
  void Answered() { in_a_row_ = 0; }
  // Counts `r` as one more; remembers what it failed with.
  void Count(const SqlResponse& r);
  // Counting one more would reach the limit.
  bool WouldGiveUp() const { return in_a_row_ + 1 >= kLimit; }
  int in_a_row() const { return in_a_row_; }
  // The failure to end with: the last one's status, how many in a row, and
  // `note` (what may be left behind).
  absl::Status GaveUp(const std::string& note) const;

 private:
  int in_a_row_ = 0;
  absl::Status last_;
};

// ---- wording both machines use ----

// What a request under the lock waited out, for LeaseRanOut: the answer's
// error (code 286 named as the quorum's), or "no answer".
std::string WaitedOut(const SqlResponse* r, absl::string_view what);
constexpr char kBusyCause[] = "code 286 (an earlier quorum write to the lock's claims is not confirmed yet)";
// A renewal, or the release's DROP or end row (`request`), met `cause` and
// the lease ran out before it could go again: lost (kAborted), nothing more
// sent; `releasing` says whether the lock was being released.
absl::Status LeaseRanOut(const std::string& state_id, absl::string_view request, const std::string& cause,
                         bool releasing);
// The answer's error while taking (or releasing) the lock, or an internal
// error when it was no error.
absl::Status AnswerError(const SqlResponse* r, absl::string_view what);
// A release that failed (`r`): the lock expires after the stale window.
absl::Status ReleaseFailed(const SqlResponse* r, const std::string& state_id, const LockOptions& options);

}  // namespace chstate

#endif  // CHSTATE_CORE_LOCK_COMMON_H_
