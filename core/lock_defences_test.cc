// One scripted test per defence of the lock (core/lock_machine.h), each named
// after the hazard it prevents: the table lock driven with scripted server
// answers and a fake clock. Every test here was checked to fail with its
// defence removed (the mutation is named above each test).
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/lock.h"
#include "core/lock_machine.h"
#include "core/response.h"
#include "core/statements.h"
#include "core/testing/responses.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::Err;
using ::chstate::testing::Lost;
using ::chstate::testing::Ok;
using ::chstate::testing::StatusIs;
using ::testing::HasSubstr;

const std::string kRandom(32, '\x22');
const std::string kOurs = MakeLockId(kRandom);
constexpr char kId[] = "dev:tap-a-to-target-b";

// An inspection answer (Statements::InspectLock's five columns), times in
// server seconds.
struct Row {
  std::string id;
  int seq;
  int64_t at_s;
};
SqlResponse Inspection(const std::vector<Row>& rows, int64_t table_created_s, int64_t now_s, int64_t stale_s = 5) {
  std::string body;
  for (const Row& r : rows) {
    body += r.id + "\t" + std::to_string(r.seq) + "\t" + std::to_string(r.at_s) + "\t" + std::to_string(now_s) + "\t" +
            std::to_string(r.seq == 0 ? stale_s : 0) + "\n";
  }
  body += "\t255\t" + std::to_string(table_created_s) + "\t" + std::to_string(now_s) + "\t0\n";
  return Ok(body);
}
// The table, with `holder`'s creation row at `created_s`.
SqlResponse HeldBy(const std::string& holder, int64_t created_s, int64_t now_s, int64_t stale_s = 5) {
  return Inspection({{holder, 0, created_s}}, created_s, now_s, stale_s);
}

Statements MakeStatements() { return *Statements::Create(Dialect::kClickHouse18, "meltano", "state"); }

LockOptions Options(int64_t stale_ms = 5000) {
  LockOptions o;
  o.timeout_ms = 120000;
  o.retry_ms = 1000;
  o.stale_ms = stale_ms;
  return o;
}

// A machine, a fake clock, and the output of the last input.
class Rig {
 public:
  explicit Rig(LockOptions options = Options()) : st_(MakeStatements()), m_(MakeLockMachine(st_, kId, options)) {}

  LockMachine& machine() { return *m_; }
  const Statements& statements() const { return st_; }
  const LockOutput& last() const { return last_; }

  // Each input happens at `at_ms` on the fake clock.
  void Acquire(int64_t at_ms) { Run(at_ms, [&](const Inputs& in) { return m_->Acquire(in); }); }
  void Release(int64_t at_ms) { Run(at_ms, [&](const Inputs& in) { return m_->Release(in); }); }
  void Answer(int64_t at_ms, const SqlResponse& r) {
    Run(at_ms, [&](const Inputs& in) { return m_->OnResponse(r, in); });
  }
  void Timer(int64_t at_ms) { Run(at_ms, [&](const Inputs& in) { return m_->OnTimer(in); }); }

  // The request the last input sent, if any.
  std::optional<SqlRequest> Sent() const {
    if (last_.next == LockOutput::Next::kRunSql) return last_.request;
    return std::nullopt;
  }
  std::string SentPurpose() const {
    std::optional<SqlRequest> r = Sent();
    return r ? r->purpose : "(nothing)";
  }
  bool Did(LockOutput::Outcome outcome) const { return last_.outcome == outcome; }
  // The last input armed a timer.
  bool Waits() const { return last_.next == LockOutput::Next::kWait; }
  absl::Status Outcome() const {
    if (last_.outcome == LockOutput::Outcome::kLost || last_.outcome == LockOutput::Outcome::kFailed) {
      return last_.status;
    }
    return absl::OkStatus();
  }

  // Acquires uncontended: CREATE sent at `sent_ms`, answered at `answered_ms`.
  void Hold(int64_t sent_ms, int64_t answered_ms) {
    Acquire(sent_ms);
    ASSERT_EQ(SentPurpose(), "create_lock");
    Answer(answered_ms, Ok());
    ASSERT_TRUE(Did(LockOutput::Outcome::kAcquired));
  }

 private:
  template <typename F>
  void Run(int64_t at_ms, F input) {
    last_ = input(Inputs{at_ms, kRandom});
  }

  Statements st_;
  std::unique_ptr<LockMachine> m_;
  LockOutput last_;
};

// ---- the lease ----

// Hazard: a holder's last write, sent just inside its lease, lands after a
// taker judged the lock stale (the request was delayed). Defence: the lease
// ends a margin (a tenth of the window) before the window, and is counted
// from when the CREATE was SENT (the server stamped it no earlier).
// Kills: LeaseMarginMs -> 0 (deadline 6000); lease counted from the answer
// (5800); InLease using <= (valid at 5500).
TEST(LockDefence, DelayedWriteLandingAfterTakeover_LeaseEndsAMarginBeforeTheWindowFromTheCreateSent) {
  Rig rig(Options(5000));
  rig.Hold(/*sent_ms=*/1000, /*answered_ms=*/1800);
  EXPECT_EQ(rig.machine().lease_deadline_ms(), 1000 + 5000 - 500);
  EXPECT_TRUE(rig.machine().LeaseValid(5499));
  EXPECT_FALSE(rig.machine().LeaseValid(5500));
  EXPECT_EQ(LeaseMarginMs(Options(5000)), 500);
  EXPECT_EQ(LeaseMarginMs(Options(300000)), 30000);
  EXPECT_EQ(LeaseMarginMs(Options(500)), 100);  // never below 100 ms
}

// The test-only hook the simulation's negative control (a) uses really
// removes the margin, and nothing else.
TEST(LockDefence, ZeroMarginHookRemovesExactlyTheMargin) {
  Rig rig(Options(5000));
  rig.machine().SetDefectsForTesting(LockDefectsForTesting{/*zero_margin=*/true});
  rig.Hold(1000, 1800);
  EXPECT_EQ(rig.machine().lease_deadline_ms(), 1000 + 5000);
}

// Hazard: a renewal whose INSERT never arrived extends the lease anyway, so
// the holder keeps writing after its rows went stale. Defence: only a
// renewal confirmed by a later look extends the lease, counted from when
// the renewal was sent.
// Kills: KeepLease extending the lease; ExtendLease counting from the
// confirmation's answer (2300 + 4500) instead of the renewal's send (2200).
TEST(LockDefence, RenewalWhoseAnswerWasLost_NeverExtendsTheLease) {
  Rig rig(Options(5000));
  rig.Hold(0, 10);
  ASSERT_EQ(rig.machine().lease_deadline_ms(), 4500);
  rig.Timer(1666);
  ASSERT_EQ(rig.SentPurpose(), "renew_lock");
  rig.Answer(1700, Lost());
  EXPECT_EQ(rig.machine().state(), LockState::kHeld);
  EXPECT_EQ(rig.machine().lease_deadline_ms(), 4500) << "a renewal that may never have landed extended the lease";
  EXPECT_TRUE(rig.Waits());
  // The INSERT answered, but the look that would confirm it did not.
  rig.Timer(2000);
  ASSERT_EQ(rig.SentPurpose(), "renew_lock");
  rig.Answer(2050, Ok());
  ASSERT_EQ(rig.SentPurpose(), "inspect_lock");
  rig.Answer(2100, Lost());
  EXPECT_EQ(rig.machine().lease_deadline_ms(), 4500) << "an unconfirmed renewal extended the lease";
  // Confirmed: counted from when that renewal was sent.
  rig.Timer(2200);
  ASSERT_EQ(rig.SentPurpose(), "renew_lock");
  rig.Answer(2250, Ok());
  ASSERT_EQ(rig.SentPurpose(), "inspect_lock");
  rig.Answer(2300, HeldBy(kOurs, 0, 2));
  EXPECT_EQ(rig.machine().lease_deadline_ms(), 2200 + 4500);
}

// Hazard: the lock was taken over (or the table holds someone else's
// creation row, or none visible) and the renewal takes the new holder's
// table for its own, keeping a lease the taker has already ended. Defence:
// the confirming look must show OUR id as the holder.
// Kills: JudgeRenewal without its `ours` check (also the
// renewal_accepts_any_holder hook).
TEST(LockDefence, RenewalFindingAnotherHoldersRow_LosesTheLock) {
  for (const std::string& other : {std::string("someone-else"), std::string()}) {
    SCOPED_TRACE(other.empty() ? "no creation row visible" : "another holder");
    Rig rig(Options(5000));
    rig.Hold(0, 10);
    rig.Timer(1666);
    ASSERT_EQ(rig.SentPurpose(), "renew_lock");
    rig.Answer(1700, Ok());
    ASSERT_EQ(rig.SentPurpose(), "inspect_lock");
    // Our renewal row is there, but the creation row is not ours.
    rig.Answer(1750, other.empty() ? Inspection({{kOurs, 1, 1}}, 0, 1)
                                   : Inspection({{other, 0, 0}, {kOurs, 1, 1}}, 0, 1));
    EXPECT_TRUE(rig.Did(LockOutput::Outcome::kLost));
    EXPECT_THAT(rig.Outcome(), StatusIs(absl::StatusCode::kAborted, HasSubstr("taken over")));
    EXPECT_FALSE(rig.machine().LeaseValid(1751));
    EXPECT_FALSE(rig.Sent().has_value());
  }
}

// Hazard: a renewal row stalled in the network lands after the lease ran
// out, between a taker's look and its RENAME, and is then read back as ours:
// the holder would go on writing under a lock a taker is moving. Defence: a
// confirmation that arrives after the lease ran out never revives it.
// Kills: JudgeRenewal without its InLease check (revive_expired_lease).
TEST(LockDefence, RenewalConfirmedAfterTheLeaseRanOut_NeverRevivesIt) {
  Rig rig(Options(5000));
  rig.Hold(0, 10);
  rig.Timer(1666);
  ASSERT_EQ(rig.SentPurpose(), "renew_lock");
  rig.Answer(4400, Ok());  // the INSERT's answer comes late, still within the lease
  ASSERT_EQ(rig.SentPurpose(), "inspect_lock");
  // The look answers after the lease ended (4500): the row is ours, but too late.
  rig.Answer(4600, Inspection({{kOurs, 0, 5}}, 0, 5));
  EXPECT_TRUE(rig.Did(LockOutput::Outcome::kLost));
  EXPECT_THAT(rig.Outcome(), StatusIs(absl::StatusCode::kAborted, HasSubstr("in flight")));
  EXPECT_FALSE(rig.machine().LeaseValid(4601));
  EXPECT_FALSE(rig.Sent().has_value());
}

// Hazard: a holder whose renewals stopped landing goes on renewing (and
// writing) after its lease ran out. Defence: the renewal timer finds the
// lease over and gives the lock up without sending anything.
// Kills: Held's timer classified without its InLease check (it would send renew_lock).
TEST(LockDefence, RenewalAfterTheLeaseRanOut_SendsNothingAndLoses) {
  Rig rig(Options(5000));
  rig.Hold(0, 10);
  rig.Timer(4500);  // the lease ended at 4500
  EXPECT_FALSE(rig.Sent().has_value()) << rig.SentPurpose();
  EXPECT_TRUE(rig.Did(LockOutput::Outcome::kLost));
  EXPECT_THAT(rig.Outcome(), StatusIs(absl::StatusCode::kAborted, HasSubstr("expired")));
}

// Hazard: a release after the lease drops the lock a taker created since
// (same table name). Defence: no DROP once the lease ran out, neither when
// the release starts nor when the look before the DROP answers late.
// Kills: the release's decision (kToRelease) without its InLease check;
// ClassifyReleaseRead without its `now >= lease_deadline` check.
TEST(LockDefence, ReleaseAfterTheLease_NeverDropsATakersLock) {
  {
    Rig rig(Options(5000));
    rig.Hold(0, 10);
    rig.Release(4500);
    EXPECT_FALSE(rig.Sent().has_value()) << rig.SentPurpose();
    EXPECT_THAT(rig.Outcome(), StatusIs(absl::StatusCode::kAborted, HasSubstr("left to expire")));
  }
  {
    Rig rig(Options(5000));
    rig.Hold(0, 10);
    rig.Release(4400);
    ASSERT_EQ(rig.SentPurpose(), "inspect_lock");
    rig.Answer(4500, HeldBy(kOurs, 0, 4));  // still ours, but the lease is over
    EXPECT_FALSE(rig.Sent().has_value()) << rig.SentPurpose();
    EXPECT_THAT(rig.Outcome(), StatusIs(absl::StatusCode::kAborted, HasSubstr("during release")));
  }
}

// Hazard: the DROP's answer was lost, the DROP did land, a new holder
// created the lock again, and a blind resend drops the new holder's lock.
// Defence: look first; drop again only if it is still ours.
// Kills: a lost DROP's answer (kLookAgain) leading to drop_lock again;
// ClassifyReleaseRead dropping without the holder check after an uncertain DROP.
TEST(LockDefence, DropWhoseAnswerWasLost_IsNotResentBlindly) {
  Rig rig(Options(5000));
  rig.Hold(0, 10);
  rig.Release(100);
  ASSERT_EQ(rig.SentPurpose(), "inspect_lock");
  rig.Answer(110, HeldBy(kOurs, 0, 0));
  ASSERT_EQ(rig.SentPurpose(), "drop_lock");
  rig.Answer(120, Lost());
  ASSERT_EQ(rig.SentPurpose(), "inspect_lock");
  rig.Answer(130, HeldBy("newer-holder", 0, 0));
  EXPECT_FALSE(rig.Sent().has_value()) << "dropped another holder's lock";
  EXPECT_TRUE(rig.Did(LockOutput::Outcome::kReleased));
}

// ---- acquiring ----

// Hazard: a CREATE whose answer was lost did land; resending it gets code
// 57 and the contender waits on (or takes over) its own lock, or it
// believes it is not the holder while its table stands. Defence: inspect;
// our id as the holder means we hold it, with the lease counted from the
// EARLIEST CREATE that may have landed.
// Kills: kMaybeLanded resending create_lock; BecomeHolderFromRead from the last
// CREATE (1100 + 4500) instead of the first uncertain one (0 + 4500).
TEST(LockDefence, CreateWhoseAnswerWasLost_IsResolvedByInspectionWithTheLeaseFromTheFirstCreate) {
  Rig rig(Options(5000));
  rig.Acquire(0);
  ASSERT_EQ(rig.SentPurpose(), "create_lock");
  rig.Answer(50, Lost());
  ASSERT_EQ(rig.SentPurpose(), "inspect_lock") << "a CREATE of unknown outcome must be settled by looking";
  // The table exists but its creation row is not visible yet: wait.
  rig.Answer(100, Inspection({}, 0, 0));
  ASSERT_TRUE(rig.Waits());
  rig.Timer(1100);
  ASSERT_EQ(rig.SentPurpose(), "create_lock");
  rig.Answer(1150, Err(500, 57, "Table meltano.state_lock_x already exists."));
  ASSERT_EQ(rig.SentPurpose(), "inspect_lock");
  rig.Answer(1200, HeldBy(kOurs, 0, 1));
  ASSERT_TRUE(rig.Did(LockOutput::Outcome::kAcquired));
  EXPECT_EQ(rig.machine().lease_deadline_ms(), 0 + 5000 - 500);
}

// Hazard: a lock table whose creation row is not visible yet (CREATE ... AS
// SELECT still writing it) looks holder-less and old; taking it over after
// one window could move a live holder's lock. Defence: such a table is only
// taken over after TWICE the window (by its creation time), and the
// tombstone is named after that creation time.
// Kills: JudgeHolder without `judged.stale_ms *= 2` (entombs at 6 s).
TEST(LockDefence, TableWhoseCreationRowIsNotVisible_IsTakenOverOnlyAfterTwiceTheWindow) {
  Rig rig(Options(5000));
  rig.Acquire(0);
  rig.Answer(10, Err(500, 57, "exists"));
  ASSERT_EQ(rig.SentPurpose(), "inspect_lock");
  rig.Answer(20, Inspection({}, /*table_created_s=*/1000, /*now_s=*/1006));  // 6 s > one window
  EXPECT_FALSE(rig.Sent().has_value()) << rig.SentPurpose();
  EXPECT_TRUE(rig.Waits());
  rig.Timer(1020);
  rig.Answer(1030, Err(500, 57, "exists"));
  rig.Answer(1040, Inspection({}, 1000, 1010));  // 10 s: not more than twice
  EXPECT_FALSE(rig.Sent().has_value()) << rig.SentPurpose();
  rig.Timer(2040);
  rig.Answer(2050, Err(500, 57, "exists"));
  rig.Answer(2060, Inspection({}, 1000, 1011));
  ASSERT_EQ(rig.SentPurpose(), "entomb_lock");
  EXPECT_EQ(rig.Sent()->sql, rig.statements().EntombLock(kId, "empty@1000").sql);
}

// Hazard (liveness, and a stale lock that never dies): rows of OTHER lock
// ids in the table (a previous holder's late renewal, a loser's insert) make
// a dead holder look fresh. Defence: the age is of the holder's own rows.
// And the holder's own renewal rows must count, or a live holder that
// renewed is taken over (safety).
// Kills: ParseLockInspection taking the newest row of any id (waits at 11 s);
// taking only the creation row (takes over a renewed holder).
TEST(LockDefence, RowsOfOtherLockIds_DoNotCountInTheHoldersAge) {
  Rig rig(Options(5000));
  rig.Acquire(0);
  rig.Answer(10, Err(500, 57, "exists"));
  // The holder "dead" wrote at 1000; a row of another id at 1009; now 1011.
  rig.Answer(20, Inspection({{"dead", 0, 1000}, {"late-other", 1, 1009}}, 1000, 1011));
  ASSERT_EQ(rig.SentPurpose(), "entomb_lock");
  absl::StatusOr<LockInspection> insp =
      ParseLockInspection(Inspection({{"dead", 0, 1000}, {"late-other", 1, 1009}}, 1000, 1011).body);
  ASSERT_TRUE(insp.ok());
  EXPECT_EQ(insp->holder, "dead");
  EXPECT_EQ(insp->age_s, 11);

  // The holder's own renewal at 1009: 2 s old, not stale.
  Rig renewed(Options(5000));
  renewed.Acquire(0);
  renewed.Answer(10, Err(500, 57, "exists"));
  renewed.Answer(20, Inspection({{"live", 0, 1000}, {"live", 1, 1009}}, 1000, 1011));
  EXPECT_FALSE(renewed.Sent().has_value()) << "took over a holder that renewed 2 s ago";
  EXPECT_TRUE(renewed.Waits());
}

// Hazard: two takers judge the same dead holder stale; both RENAME, and the
// second moves the lock the first taker has just created. Defence: the
// tombstone is named after the lock INSTANCE (the holder's random id), so
// the second rename fails (the tombstone exists), while a later instance
// gets a different tombstone.
// Kills: Entomb naming the tombstone by anything but the holder's id (e.g.
// a constant or the state id).
TEST(LockDefence, LateTakerMovingANewerLock_TombstoneIsUniqueToTheInstance) {
  auto entomb_sql = [](const std::string& holder) {
    Rig rig(Options(5000));
    rig.Acquire(0);
    rig.Answer(10, Err(500, 57, "exists"));
    rig.Answer(20, HeldBy(holder, 1000, 1100));
    EXPECT_EQ(rig.SentPurpose(), "entomb_lock");
    return rig.Sent() ? rig.Sent()->sql : std::string();
  };
  const std::string first = entomb_sql("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
  EXPECT_EQ(entomb_sql("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"), first) << "two takers of one instance must collide";
  EXPECT_NE(entomb_sql("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"), first) << "a newer instance got the same tombstone";
  // The rename that collides sends the taker back to look, never to create.
  Rig late(Options(5000));
  late.Acquire(0);
  late.Answer(10, Err(500, 57, "exists"));
  late.Answer(20, HeldBy("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 1000, 1100));
  late.Answer(30, Err(500, 57, "Table meltano.state_lock_x_dead_y already exists."));
  EXPECT_EQ(late.SentPurpose(), "inspect_lock");
}

// Hazard: a taker configured with a shorter stale window judges a holder by
// it while the holder's lease runs on its own, longer window. Defence: judge
// by the larger of the two (the holder writes its window into its lock).
// Kills: JudgeHolder ignoring insp.stale_s (also the ignore_holder_window hook).
TEST(LockDefence, TakerWithAShorterWindow_UsesTheHoldersLongerOne) {
  Rig rig(Options(2000));
  rig.Acquire(0);
  rig.Answer(10, Err(500, 57, "exists"));
  rig.Answer(20, HeldBy("holder", 1000, 1006, /*stale_s=*/10));  // 6 s old: stale for us, not for it
  EXPECT_FALSE(rig.Sent().has_value()) << rig.SentPurpose();
  EXPECT_TRUE(rig.Waits());
}

// ---- code 159: distributed DDL timeout ----

// ClickHouse code 159 (TIMEOUT_EXCEEDED; on ON CLUSTER DDL: a host did not
// run it within distributed_ddl_task_timeout) is UNAVAILABLE, "retry later",
// with the code attached (the CLI maps UNAVAILABLE to exit code 5).
// Cluster mode: which claims may be removed (Statements::PruneClaims). A
// claim is prunable only when its holder's lease is over by the holder's own
// window: ended (the end row is written within the lease), taken over (a
// taker judged it stale), or stale by its own window; never ours, never a
// live claim, whatever the reader's window.
// Mutations: claims-prune-live, claims-prune-slack, claims-prune-orphan-early.
TEST(LockDefence, PrunableClaims_AreOnlyThoseWhoseHolderNoLongerActs) {
  struct Case {
    const char* what;
    std::string row;  // lock id, claims, ends, newest, stale_s, over, now
    bool dead;
  };
  const std::string ours = "ours";
  static const Case kCases[] = {
      {"live, renewed just now", "a\t1\t0\t1000\t300\t\t1000\n", false},
      {"live at the edge of its own window and slack", "a\t1\t0\t699\t300\t\t1000\n", false},
      {"stale by its own window", "a\t1\t0\t698\t300\t\t1000\n", true},
      {"a short window, stale by it though a longer reader counts it live", "a\t1\t0\t990\t5\t\t1000\n", true},
      {"ended", "a\t1\t1\t1000\t300\t\t1000\n", true},
      {"taken over by another claim", "a\t1\t0\t1000\t300\t\t1000\nb\t1\t0\t1000\t300\ta\t1000\n", true},
      {"ours, ended", "ours\t1\t1\t1000\t300\t\t1000\n", false},
      {"an end row of a claim never seen, recent", "a\t0\t1\t1000\t0\t\t1000\n", false},
      {"an end row of a claim never seen, a day old", "a\t0\t1\t1000\t0\t\t87401\n", true},
      {"the same, exactly a day old", "a\t0\t1\t1000\t0\t\t87400\n", false},
  };
  for (const Case& c : kCases) {
    absl::StatusOr<LockInspection> insp = ParseClaimInspection(c.row, ours, /*stale_s=*/3000);
    ASSERT_TRUE(insp.ok()) << c.what << ": " << insp.status();
    const bool dead = std::find(insp->dead.begin(), insp->dead.end(), "a") != insp->dead.end() ||
                      std::find(insp->dead.begin(), insp->dead.end(), "ours") != insp->dead.end();
    EXPECT_EQ(dead, c.dead) << c.what;
    EXPECT_EQ(std::count(insp->dead.begin(), insp->dead.end(), "b"), 0) << c.what << ": the live taker";
  }
}

TEST(ErrorClassification, Code159IsUnavailableWithTheCodeAndRetryLater) {
  absl::Status s = CheckResponse(Err(500, 159,
                                     "Watching task /clickhouse/task_queue/ddl/query-0000000001 is executing longer "
                                     "than distributed_ddl_task_timeout (=10) seconds"),
                                 "taking the lock");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ClickHouse error 159 while taking the lock"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("distributed_ddl_task_timeout"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("Retry later"));
  EXPECT_EQ(ClickHouseCode(s), 159);
  // The same code in the header of an HTTP 200 answer.
  SqlResponse header = Ok("Code: 159. DB::Exception: Timeout exceeded. (TIMEOUT_EXCEEDED)\n");
  header.exception_code_header = "159";
  EXPECT_EQ(CheckResponse(header, "reading").code(), absl::StatusCode::kUnavailable);
}

// On the lock's CREATE, 159 means the CREATE ran on some hosts: settled by
// looking, like a lost answer (never a failure, never a blind resend); on
// the look itself it is a failure with that status.
TEST(ErrorClassification, Code159OnTheLockCreateIsSettledByInspecting) {
  Rig rig(Options(5000));
  rig.Acquire(0);
  rig.Answer(10, Err(500, 159, "Watching task is executing longer than distributed_ddl_task_timeout"));
  ASSERT_EQ(rig.SentPurpose(), "inspect_lock");
  rig.Answer(20, HeldBy(kOurs, 0, 0));
  EXPECT_TRUE(rig.Did(LockOutput::Outcome::kAcquired));
  EXPECT_EQ(rig.machine().lease_deadline_ms(), 4500);

  Rig other(Options(5000));
  other.Acquire(0);
  other.Answer(10, Err(500, 159, "Watching task is executing longer than distributed_ddl_task_timeout"));
  other.Answer(20, Err(500, 159, "Timeout exceeded"));
  EXPECT_TRUE(other.Did(LockOutput::Outcome::kFailed));
  EXPECT_THAT(other.Outcome(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("ClickHouse error 159")));

  // Any other server error on the CREATE fails at once.
  Rig plain(Options(5000));
  plain.Acquire(0);
  plain.Answer(10, Err(500, 241, "Memory limit exceeded"));
  EXPECT_FALSE(plain.Sent().has_value());
  EXPECT_THAT(plain.Outcome(), StatusIs(absl::StatusCode::kInternal, HasSubstr("241")));
}

}  // namespace
}  // namespace chstate
