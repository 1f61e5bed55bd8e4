// The core and the native executor against a real ClickHouse server: values
// no command line can carry (NUL bytes) and the write-ordering guarantees.
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/store.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hosts/native/executor.h"

namespace chstate {
namespace {

using ::chstate::testing::IsOk;
using ::chstate::testing::StatusIs;
using ::testing::HasSubstr;
using native::HttpExecutor;
using native::RunTask;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Env("CHSTATE_TEST_PORT").empty())
        << "CHSTATE_TEST_* is not set: run through tools/test, which starts a ClickHouse server";
    config_.host = Env("CHSTATE_TEST_HOST");
    ASSERT_TRUE(absl::SimpleAtoi(Env("CHSTATE_TEST_PORT"), &config_.port));
    config_.user = Env("CHSTATE_TEST_USER");
    config_.password = Env("CHSTATE_TEST_PASSWORD");
    config_.database = "default";
    StoreOptions o;
    o.schema = absl::StrCat("native_", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    schema_ = o.schema;
    o.lock.timeout_ms = 2000;
    o.lock.retry_ms = 50;
    ASSERT_OK_AND_ASSIGN(store_, Store::Create(o));
    exec_ = std::make_unique<HttpExecutor>(config_);
    ASSERT_THAT(RunTask(*store_->Init(), *exec_), IsOk());
  }
  void TearDown() override {
    if (!exec_) return;
    SqlRequest drop;
    drop.sql = absl::StrCat("DROP DATABASE IF EXISTS `", schema_, "`");
    exec_->Execute(drop);
  }

  absl::StatusOr<Result> Run(std::unique_ptr<Task> t) { return RunTask(*t, *exec_); }

  ConnectionConfig config_;
  std::string schema_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpExecutor> exec_;
};

MeltanoState Complete(std::string id, nlohmann::json completed) {
  return MeltanoState{std::move(id), nlohmann::json::object(), std::move(completed)};
}

TEST_F(ServerTest, HostileIdsRoundTripByteExact) {
  std::string all_bytes;
  for (int i = 1; i < 256; ++i) all_bytes.push_back(static_cast<char>(i));
  const std::string kIds[] = {
      std::string("nul\0inside", 10),
      std::string("\0", 1),
      "quote ' and \\' and \\\\",
      "'); DROP TABLE state; --",
      "line\nbreak\r\ttab",
      "100% _under_ *star* ?q?",
      "\xff\xfe invalid utf-8 \xc3",
      "{state_id:String}",
      all_bytes,
      std::string(100 * 1024, 'k') + "'end",
  };
  for (const std::string& id : kIds) {
    SCOPED_TRACE(id.substr(0, 30));
    nlohmann::json completed = {{"singer_state", {{"id_length", id.size()}}}};
    ASSERT_THAT(Run(store_->Set(Complete(id, completed))), IsOk());
    ASSERT_OK_AND_ASSIGN(Result got, Run(store_->Get(id)));
    ASSERT_TRUE(got.state.has_value());
    EXPECT_EQ(got.state->completed, completed);
  }
  ASSERT_OK_AND_ASSIGN(Result listed, Run(store_->List(std::nullopt)));
  for (const std::string& id : kIds) {
    EXPECT_NE(std::find(listed.state_ids.begin(), listed.state_ids.end(), id), listed.state_ids.end())
        << "missing from list: " << id.substr(0, 30);
  }
  EXPECT_EQ(listed.state_ids.size(), std::size(kIds));
  // Deleting one hostile id removes exactly that one.
  ASSERT_THAT(Run(store_->Delete(kIds[0])), IsOk());
  ASSERT_OK_AND_ASSIGN(Result after, Run(store_->List(std::nullopt)));
  EXPECT_EQ(after.state_ids.size(), std::size(kIds) - 1);
  ASSERT_OK_AND_ASSIGN(Result gone, Run(store_->Get(kIds[0])));
  EXPECT_FALSE(gone.state.has_value());
  ASSERT_OK_AND_ASSIGN(Result kept, Run(store_->Get(kIds[1])));
  EXPECT_TRUE(kept.state.has_value());
}

TEST_F(ServerTest, RepeatedWritesAllLand) {
  // A, B, A within one second: equal versions on 18.x, and a repeat of an
  // earlier block on servers that deduplicate.
  nlohmann::json a = {{"singer_state", {{"v", "A"}}}};
  nlohmann::json b = {{"singer_state", {{"v", "B"}}}};
  for (int round = 0; round < 5; ++round) {
    ASSERT_THAT(Run(store_->Set(Complete("aba", a))), IsOk());
    ASSERT_THAT(Run(store_->Set(Complete("aba", b))), IsOk());
    ASSERT_THAT(Run(store_->Set(Complete("aba", a))), IsOk());
    ASSERT_OK_AND_ASSIGN(Result got, Run(store_->Get("aba")));
    ASSERT_TRUE(got.state.has_value());
    EXPECT_EQ(got.state->completed, a) << "round " << round;
    ASSERT_THAT(Run(store_->Set(Complete("aba", b))), IsOk());
    ASSERT_OK_AND_ASSIGN(Result got_b, Run(store_->Get("aba")));
    EXPECT_EQ(got_b.state->completed, b) << "round " << round;
  }
}

TEST_F(ServerTest, LikePatternsMatchLiterally) {
  for (const char* id : {"a_b1", "axb1", "a%b2", "azzb2", "a\\b3"}) {
    ASSERT_THAT(Run(store_->Set(Complete(id, {{"x", 1}}))), IsOk());
  }
  struct Case {
    const char* glob;
    std::vector<std::string> ids;
  };
  const Case kCases[] = {
      {"a_b*", {"a_b1"}},
      {"a%b*", {"a%b2"}},
      {"a\\b*", {"a\\b3"}},
      {"a?b*", {"a%b2", "a\\b3", "a_b1", "axb1"}},
      {"*2", {"a%b2", "azzb2"}},
      {"*", {"a%b2", "a\\b3", "a_b1", "axb1", "azzb2"}},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.glob);
    ASSERT_OK_AND_ASSIGN(Result r, Run(store_->List(std::string(c.glob))));
    EXPECT_EQ(r.state_ids, c.ids);
  }
}

TEST_F(ServerTest, LockExcludesASecondHolderUntilReleased) {
  ASSERT_OK_AND_ASSIGN(Result first, Run(store_->AcquireLock("job")));
  StoreOptions o = store_->options();
  o.lock.timeout_ms = 0;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Store> other, Store::Create(o));
  EXPECT_THAT(RunTask(*other->AcquireLock("job"), *exec_), StatusIs(absl::StatusCode::kAborted, HasSubstr("job")));
  EXPECT_THAT(RunTask(*other->ReleaseLock("job", "not-the-holder"), *exec_),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("only the process that acquired")));
  ASSERT_THAT(Run(store_->ReleaseLock("job", first.lock_id)), IsOk());
  ASSERT_OK_AND_ASSIGN(Result second, RunTask(*other->AcquireLock("job"), *exec_));
  EXPECT_NE(second.lock_id, first.lock_id);
  ASSERT_THAT(RunTask(*other->ReleaseLock("job", second.lock_id), *exec_), IsOk());
}

TEST_F(ServerTest, ClearAllCountsStates) {
  for (int i = 0; i < 7; ++i) ASSERT_THAT(Run(store_->Set(Complete(absl::StrCat("id", i), {{"i", i}}))), IsOk());
  ASSERT_THAT(Run(store_->Set(Complete("id0", {{"i", 100}}))), IsOk());  // a second version of one id
  ASSERT_OK_AND_ASSIGN(Result cleared, Run(store_->ClearAll()));
  EXPECT_EQ(cleared.count, 7);
  ASSERT_OK_AND_ASSIGN(Result listed, Run(store_->List(std::nullopt)));
  EXPECT_TRUE(listed.state_ids.empty());
}

TEST_F(ServerTest, StoppedServerIsUnavailableNamingTheEndpoint) {
  ConnectionConfig closed = config_;
  closed.port = 1;  // nothing listens on port 1 here
  HttpExecutor dead(closed, {.connect_timeout_ms = 1000});
  StoreOptions o;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Store> s, Store::Create(o));
  absl::StatusOr<Result> r = RunTask(*s->Ping(), dead);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(":1")));
  EXPECT_THAT(r.status().message(), ::testing::Not(HasSubstr(config_.password.empty() ? "\x01" : config_.password)));
}

TEST_F(ServerTest, WrongPasswordIsUnauthenticated) {
  ConnectionConfig wrong = config_;
  wrong.password = "definitely-wrong-password";
  HttpExecutor exec(wrong);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Store> s, Store::Create(StoreOptions{}));
  absl::StatusOr<Result> r = RunTask(*s->Ping(), exec);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("password")));
  EXPECT_THAT(r.status().message(), ::testing::Not(HasSubstr("definitely-wrong-password")));
}

}  // namespace
}  // namespace chstate
