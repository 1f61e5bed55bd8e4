// What a store tells a person watching it: levels, redaction, and the
// diagnostics the transport policy and the lock emit, driven with scripted
// answers.
#include "core/diagnostics.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/connection.h"
#include "core/store.h"
#include "core/testing/responses.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::IsOk;
using ::chstate::testing::Ok;
using ::chstate::testing::Refused;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kRandom(32, '\x22');

TEST(RedactStates, StateLiteralsBecomeTheirSize) {
  static const struct {
    const char* sql;
    const char* redacted;
  } kCases[] = {
      {"SELECT 1", "SELECT 1"},
      {"INSERT INTO t VALUES ('dev:a', '{\"x\":1}', NULL)", "INSERT INTO t VALUES ('dev:a', '<state: 7 bytes>', NULL)"},
      // An escaped quote inside a state does not end it.
      {"VALUES ('{\"a\":\"it\\'s\"}', 'b')", "VALUES ('<state: 13 bytes>', 'b')"},
      // A literal that is not an object is kept (ids, tokens).
      {"WHERE state_id = 'x{y}'", "WHERE state_id = 'x{y}'"},
      // An unterminated literal is not read past the end.
      {"VALUES ('{\"a\"", "VALUES ('<state: 4 bytes>"},
  };
  for (const auto& c : kCases) EXPECT_EQ(RedactStates(c.sql), c.redacted) << c.sql;
}

TEST(DiagnosticLine, AStatementShowsItsSqlOnOneLineAndOthersTheirMessage) {
  Diagnostic d;
  d.kind = DiagnosticKind::kStatement;
  d.message = "create_table (attempt 1): ok in 3 ms";
  d.texts = {{"purpose", "create_table"}, {"sql", "CREATE TABLE t\n  (a String,\r\n\tb String)\nENGINE = Log"}};
  EXPECT_EQ(DiagnosticLine(d), "create_table (attempt 1): ok in 3 ms: CREATE TABLE t (a String, b String) ENGINE = Log");
  d.kind = DiagnosticKind::kResent;
  d.message = "ping is sent again";
  EXPECT_EQ(DiagnosticLine(d), "ping is sent again");
}

TEST(Diagnostics, NothingBelowTheLevelIsKept) {
  Diagnostics d;
  EXPECT_FALSE(d.Wants(DiagnosticLevel::kWarning));  // kNone by default: a host asks for what it wants
  d.set_level(DiagnosticLevel::kInfo);
  EXPECT_TRUE(d.Wants(DiagnosticLevel::kWarning));
  EXPECT_TRUE(d.Wants(DiagnosticLevel::kInfo));
  EXPECT_FALSE(d.Wants(DiagnosticLevel::kDebug));
  Diagnostic debug;
  debug.level = DiagnosticLevel::kDebug;
  d.Emit(debug);
  EXPECT_TRUE(d.empty());
  Diagnostic info;
  info.level = DiagnosticLevel::kInfo;
  info.message = "kept";
  d.Emit(info);
  std::optional<Diagnostic> got = d.Poll();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->message, "kept");
  EXPECT_FALSE(d.Poll().has_value());
}

TEST(Diagnostics, AHostThatNeverTakesThemKeepsTheNewest) {
  Diagnostics d;
  d.set_level(DiagnosticLevel::kDebug);
  for (int i = 0; i < 5000; ++i) {
    Diagnostic x;
    x.level = DiagnosticLevel::kDebug;
    x.message = std::to_string(i);
    d.Emit(x);
  }
  std::optional<Diagnostic> first = d.Poll();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->message, "4000");
}

std::unique_ptr<Store> MakeStore() {
  StoreOptions o;
  o.lock.stale_ms = 300000;
  o.lock.timeout_ms = 10000;
  absl::StatusOr<std::unique_ptr<Store>> s = Store::Create(o);
  EXPECT_THAT(s, IsOk());
  return std::move(*s);
}

std::vector<Diagnostic> Drain(Store& store) {
  std::vector<Diagnostic> out;
  while (std::optional<Diagnostic> d = store.diagnostics().Poll()) out.push_back(std::move(*d));
  return out;
}

const Diagnostic* Find(const std::vector<Diagnostic>& all, DiagnosticKind kind) {
  for (const Diagnostic& d : all) {
    if (d.kind == kind) return &d;
  }
  return nullptr;
}

TEST(Diagnostics, AResendIsToldWithItsCauseAndAttempt) {
  std::unique_ptr<Store> store = MakeStore();
  store->diagnostics().set_level(DiagnosticLevel::kInfo);
  std::unique_ptr<Task> t = store->Ping();
  int64_t now = 1000;
  Action a = t->Start({now, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  a = t->OnResponse(Refused(), {now += 5, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kWait);
  std::vector<Diagnostic> told = Drain(*store);
  const Diagnostic* resent = Find(told, DiagnosticKind::kResent);
  ASSERT_NE(resent, nullptr);
  EXPECT_EQ(resent->level, DiagnosticLevel::kInfo);
  EXPECT_EQ(resent->at_ms, now);
  EXPECT_THAT(resent->message, AllOf(HasSubstr("attempt 2 of"), HasSubstr("refused")));
  // Statements are debug: not made at info.
  EXPECT_EQ(Find(told, DiagnosticKind::kStatement), nullptr);
}

TEST(Diagnostics, AtDebugEachStatementIsToldWithItsTimeAndNoStateContents) {
  std::unique_ptr<Store> store = MakeStore();
  store->diagnostics().set_level(DiagnosticLevel::kDebug);
  MeltanoState state;
  state.state_id = "dev:a";
  state.completed = nlohmann::json::parse(R"({"singer_state":{"secret_bookmark":"2026-12-05"}})");
  Connection conn(store.get());
  int64_t now = 0;
  conn.Start(store->Set(state), {now, kRandom});
  std::vector<Diagnostic> told;
  // Answer every request "ok" (the version first), 7 ms later each.
  for (int i = 0; i < 20; ++i) {
    std::optional<Transmit> tx = conn.PollTransmit();
    if (!tx) break;
    std::string body;
    if (tx->request.purpose == "select_version") body = "18.16.1\t0\n";
    if (tx->request.purpose == "create_lock") body = "";
    if (tx->request.purpose == "inspect_lock") body = "";
    ASSERT_THAT(conn.HandleResponse(tx->op, Ok(body), {now += 7, kRandom}), IsOk());
  }
  while (std::optional<Diagnostic> d = conn.PollDiagnostic()) told.push_back(std::move(*d));
  const Diagnostic* insert = nullptr;
  for (const Diagnostic& d : told) {
    EXPECT_THAT(d.message, Not(HasSubstr("secret_bookmark")));
    for (const auto& [k, v] : d.texts) EXPECT_THAT(v, Not(HasSubstr("secret_bookmark"))) << k;
    for (const auto& [k, v] : d.texts) {
      if (k == "purpose" && v == "insert_state") insert = &d;
    }
  }
  ASSERT_NE(insert, nullptr) << "no statement diagnostic for the state's INSERT";
  EXPECT_EQ(insert->kind, DiagnosticKind::kStatement);
  EXPECT_THAT(insert->message, HasSubstr("in 7 ms"));
  bool has_sql = false;
  for (const auto& [k, v] : insert->texts) {
    if (k == "sql") {
      has_sql = true;
      EXPECT_THAT(v, HasSubstr("<state: "));
    }
  }
  EXPECT_TRUE(has_sql);
  // Redaction off on purpose: the contents are there.
  store->diagnostics().set_redact_states(false);
  conn.Start(store->Set(state), {now, kRandom});
  for (int i = 0; i < 20; ++i) {
    std::optional<Transmit> tx = conn.PollTransmit();
    if (!tx) break;
    ASSERT_THAT(conn.HandleResponse(tx->op, Ok(""), {now += 7, kRandom}), IsOk());
  }
  bool shown = false;
  while (std::optional<Diagnostic> d = conn.PollDiagnostic()) {
    for (const auto& [k, v] : d->texts) shown = shown || (k == "sql" && v.find("secret_bookmark") != std::string::npos);
  }
  EXPECT_TRUE(shown);
}

TEST(Diagnostics, ALevelOfNoneMakesNothing) {
  std::unique_ptr<Store> store = MakeStore();
  std::unique_ptr<Task> t = store->Ping();
  Action a = t->Start({0, kRandom});
  ASSERT_EQ(a.kind, Action::Kind::kRunSql);
  t->OnResponse(Refused(), {5, kRandom});
  EXPECT_TRUE(store->diagnostics().empty());
}

}  // namespace
}  // namespace chstate

namespace chstate {
namespace {

TEST(Diagnostics, AWaitForALockHeldByAnotherProcessIsToldWithTheHolderAndTimes) {
  std::unique_ptr<Store> store = MakeStore();
  store->diagnostics().set_level(DiagnosticLevel::kInfo);
  std::unique_ptr<Task> t = store->AcquireLock("dev:a");
  int64_t now = 0;
  Action a = t->Start({now, kRandom});
  // The version, the Python backend's rows (none), then CREATE meets the
  // lock another process holds, renewed 4 s ago with a 300 s window.
  std::vector<Diagnostic> told;
  for (int i = 0; i < 10 && a.kind == Action::Kind::kRunSql; ++i) {
    const std::string& p = a.request.purpose;
    SqlResponse r = Ok("");
    if (p == "select_version") r = Ok("18.16.1\t0\n");
    if (p == "create_lock") r = ::chstate::testing::Err(500, 57, "Table already exists");
    if (p == "inspect_lock") r = Ok("otherholder\t0\t1000\t1004\t300\n\t255\t1000\t1004\t0\n");
    a = t->OnResponse(r, {now += 3, kRandom});
  }
  ASSERT_EQ(a.kind, Action::Kind::kWait);
  while (std::optional<Diagnostic> d = store->diagnostics().Poll()) told.push_back(std::move(*d));
  const Diagnostic* waiting = Find(told, DiagnosticKind::kLockWaiting);
  ASSERT_NE(waiting, nullptr);
  EXPECT_EQ(waiting->state_id, "dev:a");
  EXPECT_THAT(waiting->message, AllOf(HasSubstr("otherholder"), HasSubstr("4 s ago"), HasSubstr("296 s more"),
                                      HasSubstr(absl::StrCat("next try in ", a.wait_ms, " ms"))));
}

// An acquisition that met nobody is debug (its round trips take time too);
// one that waited for another process is told at info.
TEST(Diagnostics, AnAcquisitionIsToldAtInfoOnlyWhenItWaitedForAnotherProcess) {
  auto acquire = [](bool contended) {
    std::unique_ptr<Store> store = MakeStore();
    store->diagnostics().set_level(DiagnosticLevel::kDebug);
    std::unique_ptr<Task> t = store->AcquireLock("dev:a");
    int64_t now = 0;
    bool met = false;
    Action a = t->Start({now, kRandom});
    for (int i = 0; i < 20 && a.kind != Action::Kind::kDone && a.kind != Action::Kind::kFailed; ++i) {
      if (a.kind == Action::Kind::kWait) {
        a = t->OnTimer({now += a.wait_ms, kRandom});
        continue;
      }
      const std::string& p = a.request.purpose;
      SqlResponse r = Ok("");
      if (p == "select_version") r = Ok("18.16.1\t0\n");
      if (p == "create_lock" && contended && !met) r = ::chstate::testing::Err(500, 57, "Table already exists");
      if (p == "inspect_lock" && contended && !met) {
        r = Ok("otherholder\t0\t1000\t1004\t300\n\t255\t1000\t1004\t0\n");
        met = true;
      } else if (p == "inspect_lock") {
        r = Ok(absl::StrCat("chstate-", std::string(32, '0'), "\t0\t1000\t1000\t30\n\t255\t1000\t1000\t0\n"));
      }
      a = t->OnResponse(r, {now += 3, kRandom});
    }
    std::vector<Diagnostic> told;
    while (std::optional<Diagnostic> d = store->diagnostics().Poll()) told.push_back(std::move(*d));
    const Diagnostic* acquired = Find(told, DiagnosticKind::kLockAcquired);
    return std::make_pair(a.kind, acquired ? std::optional<DiagnosticLevel>(acquired->level) : std::nullopt);
  };
  auto [free_end, free_level] = acquire(false);
  ASSERT_EQ(free_end, Action::Kind::kDone);
  EXPECT_EQ(free_level, DiagnosticLevel::kDebug);
  auto [held_end, held_level] = acquire(true);
  ASSERT_EQ(held_end, Action::Kind::kDone);
  EXPECT_EQ(held_level, DiagnosticLevel::kInfo);
}

}  // namespace
}  // namespace chstate
