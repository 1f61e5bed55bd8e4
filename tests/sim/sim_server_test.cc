// The simulated ClickHouse server answers the lock statements the way the
// core expects to read them (checked with the core's own parsers), in both
// error formats, and refuses statements it does not know.
#include "tests/sim/sim_server.h"

#include <random>
#include <set>
#include <string>

#include "core/lock_machine.h"
#include "core/response.h"
#include "core/statements.h"
#include "gtest/gtest.h"

namespace chstate::sim {
namespace {

constexpr int64_t kT0 = 1700000000000;  // true ms; server seconds 1700000000
constexpr char kId[] = "dev:tap-a-to-target-b";

class SimServerTest : public ::testing::TestWithParam<Dialect> {
 protected:
  SimServerTest() : st_(*Statements::Create(GetParam(), "meltano", "state")), server_(Options(), &rng_) {}
  ServerOptions Options() {
    ServerOptions o;
    o.dialect = GetParam();
    return o;
  }
  std::optional<int> Code(const Execution& e) { return ClickHouseCode(CheckResponse(e.response, "test")); }

  std::mt19937_64 rng_{1};
  Statements st_;
  SimServer server_;
};

TEST_P(SimServerTest, CreateIsTestAndSet) {
  Execution a = server_.Execute(st_.CreateLock(kId, "aaaa", 5), kT0);
  EXPECT_TRUE(CheckResponse(a.response, "create").ok()) << a.response.body;
  Execution b = server_.Execute(st_.CreateLock(kId, "bbbb", 5), kT0 + 5);
  EXPECT_EQ(Code(b), 57) << b.response.body;
  if (GetParam() == Dialect::kClickHouse18) {
    EXPECT_EQ(b.response.http_status, 500);
    EXPECT_EQ(b.response.body, "Code: 57, e.displayText() = DB::Exception: Table meltano." +
                                   st_.LockTableName(kId) + " already exists., e.what() = DB::Exception\n");
  }
  EXPECT_TRUE(server_.unrecognized().empty());
}

TEST_P(SimServerTest, InspectionParsesWithTheCoresParser) {
  server_.Execute(st_.CreateLock(kId, "aaaa", 5), kT0 + 200);
  server_.Execute(st_.RenewLock(kId, "bbbb", 5), kT0 + 1500);  // another id: ignored
  server_.Execute(st_.RenewLock(kId, "aaaa", 5), kT0 + 2100);
  Execution e = server_.Execute(st_.InspectLock(kId), kT0 + 9999);
  ASSERT_EQ(e.response.http_status, 200) << e.response.body;
  absl::StatusOr<LockInspection> insp = ParseLockInspection(e.response.body);
  ASSERT_TRUE(insp.ok()) << insp.status();
  EXPECT_TRUE(insp->exists);
  EXPECT_EQ(insp->holder, "aaaa");
  EXPECT_EQ(insp->age_s, 9 - 2);  // newest holder row at second 2, now second 9
  EXPECT_EQ(insp->stale_s, 5);
}

TEST_P(SimServerTest, MissingTableIsCode60) {
  Execution e = server_.Execute(st_.InspectLock(kId), kT0);
  EXPECT_EQ(Code(e), 60) << e.response.body;
  EXPECT_EQ(Code(server_.Execute(st_.RenewLock(kId, "aaaa", 5), kT0)), 60);
  EXPECT_TRUE(CheckResponse(server_.Execute(st_.DropLock(kId), kT0).response, "drop").ok());
}

TEST_P(SimServerTest, RenameMovesOnceAndTombstonesBlockLaterInstances) {
  server_.Execute(st_.CreateLock(kId, "aaaa", 5), kT0);
  int renames = 0;
  server_.on_rename = [&](const std::string&, const std::string& to, const Table& t, int64_t) {
    ++renames;
    EXPECT_EQ(to, st_.TombstoneName(kId, "aaaa@1700000000"));
    EXPECT_EQ(t.rows.size(), 1u);
  };
  EXPECT_TRUE(CheckResponse(server_.Execute(st_.EntombLock(kId, "aaaa@1700000000"), kT0 + 1).response, "r").ok());
  EXPECT_EQ(Code(server_.Execute(st_.EntombLock(kId, "aaaa@1700000000"), kT0 + 2)), 60);
  server_.Execute(st_.CreateLock(kId, "cccc", 5), kT0 + 3);
  EXPECT_EQ(Code(server_.Execute(st_.EntombLock(kId, "aaaa@1700000000"), kT0 + 4)), 57);
  EXPECT_EQ(renames, 1);
  ASSERT_NE(server_.Find(st_.LockTableName(kId)), nullptr);
  EXPECT_EQ(server_.Find(st_.LockTableName(kId))->rows[0].lock_id, "cccc");
}

TEST_P(SimServerTest, MissingDatabaseIsCode81UntilCreated) {
  ServerOptions o = Options();
  o.database_exists = false;
  SimServer server(o, &rng_);
  EXPECT_EQ(Code(server.Execute(st_.CreateLock(kId, "aaaa", 5), kT0)), 81);
  EXPECT_TRUE(CheckResponse(server.Execute(st_.CreateDatabase(), kT0).response, "db").ok());
  EXPECT_TRUE(CheckResponse(server.Execute(st_.CreateLock(kId, "aaaa", 5), kT0).response, "create").ok());
}

TEST_P(SimServerTest, CreationRowCanBeVisibleLate) {
  ServerOptions o = Options();
  o.create_visibility_prob = 1;
  o.create_visibility_max_ms = 1000;
  SimServer server(o, &rng_);
  Execution c = server.Execute(st_.CreateLock(kId, "aaaa", 5), kT0);
  ASSERT_GT(c.done_ms, kT0);  // the creator's answer waits for the row
  EXPECT_EQ(Code(server.Execute(st_.CreateLock(kId, "bbbb", 5), kT0 + 1)), 57);
  Execution early = server.Execute(st_.InspectLock(kId), c.done_ms - 1);
  absl::StatusOr<LockInspection> insp = ParseLockInspection(early.response.body);
  ASSERT_TRUE(insp.ok());
  EXPECT_TRUE(insp->exists);
  EXPECT_EQ(insp->holder, "");
  insp = ParseLockInspection(server.Execute(st_.InspectLock(kId), c.done_ms).response.body);
  ASSERT_TRUE(insp.ok());
  EXPECT_EQ(insp->holder, "aaaa");
}

TEST_P(SimServerTest, TableBeingDroppedAndUnionHalvesAcrossASecond) {
  ServerOptions o = Options();
  o.dropped_race_ms = 1000;
  o.union_now_spread_ms = 999;
  SimServer server(o, &rng_);
  server.Execute(st_.CreateLock(kId, "aaaa", 5), kT0);
  server.Execute(st_.DropLock(kId), kT0 + 10);
  std::set<int> codes;
  for (int i = 0; i < 50; ++i) codes.insert(Code(server.Execute(st_.InspectLock(kId), kT0 + 20 + i)).value_or(0));
  EXPECT_EQ(codes, (std::set<int>{60, 218}));
  EXPECT_EQ(Code(server.Execute(st_.InspectLock(kId), kT0 + 1010)), 60);  // long gone
  // The halves' now() may differ by a second; the core takes the later one.
  server.Execute(st_.CreateLock(kId, "bbbb", 5), kT0 + 2000);
  std::set<std::string> bodies;
  for (int i = 0; i < 50; ++i) bodies.insert(server.Execute(st_.InspectLock(kId), kT0 + 2500).response.body);
  EXPECT_GT(bodies.size(), 1u);
  for (const std::string& body : bodies) {
    absl::StatusOr<LockInspection> insp = ParseLockInspection(body);
    ASSERT_TRUE(insp.ok()) << body;
    EXPECT_EQ(insp->holder, "bbbb");
  }
}

TEST_P(SimServerTest, UnknownStatementsFailLoudly) {
  SqlRequest r;
  r.purpose = "mystery";
  r.sql = "SELECT 1";
  Execution e = server_.Execute(r, kT0);
  EXPECT_FALSE(CheckResponse(e.response, "x").ok());
  ASSERT_EQ(server_.unrecognized().size(), 1u);
  // A near miss is not accepted either.
  SqlRequest near = st_.CreateLock(kId, "aaaa", 5);
  near.sql += " ";
  server_.Execute(near, kT0);
  EXPECT_EQ(server_.unrecognized().size(), 2u);
}

TEST_P(SimServerTest, ReplacingMergeTreeFinalKeepsNewestAndLaterInsert) {
  ASSERT_TRUE(CheckResponse(server_.Execute(st_.CreateLockTable(), kT0).response, "t").ok());
  auto insert = [&](const std::string& lock_id, int64_t t) {
    SqlRequest r;
    r.sql = "INSERT INTO `meltano`.`state_lock` (state_id, lock_id) VALUES ('s', '" + lock_id + "')";
    return server_.Execute(r, t);
  };
  SqlRequest select;
  select.sql =
      "SELECT lock_id, toInt64(locked_at), toInt64(now()) FROM `meltano`.`state_lock` FINAL WHERE state_id = 's' "
      "FORMAT TabSeparated";
  insert("bbbb", kT0);
  insert("aaaa", kT0 + 10);  // same second, later insert: wins under FINAL
  EXPECT_EQ(server_.Execute(select, kT0 + 20).response.body, "aaaa\t1700000000\t1700000000\n");
  server_.Merge(kT0 + 30);
  EXPECT_EQ(server_.tables().at("state_lock").rows.size(), 1u);
  EXPECT_TRUE(server_.unrecognized().empty());
}

INSTANTIATE_TEST_SUITE_P(Dialects, SimServerTest, ::testing::Values(Dialect::kClickHouse18, Dialect::kModern),
                         [](const ::testing::TestParamInfo<Dialect>& info) {
                           return std::string(info.param == Dialect::kModern ? "modern" : "ch18");
                         });

}  // namespace
}  // namespace chstate::sim
