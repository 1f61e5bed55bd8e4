#include "core/settings.h"

#include <algorithm>
#include <string>

#include "absl/strings/escaping.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::IsOk;
using ::chstate::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kUri[] = "clickhouse://alice@db.example:8123/analytics";

SettingsSources Api(std::map<std::string, std::string> values, std::map<std::string, std::string> env = {}) {
  SettingsSources s;
  s.from = SettingsFrom::kApi;
  s.values = std::move(values);
  s.env = std::move(env);
  return s;
}

TEST(SettingsTest, EveryDefault) {
  absl::StatusOr<Settings> s = ResolveSettings(Api({{"uri", kUri}}));
  ASSERT_THAT(s, IsOk());
  const StoreOptions& o = s->store;
  EXPECT_EQ(o.schema, "meltano");
  EXPECT_EQ(o.table, "state");
  EXPECT_EQ(o.endpoint, "db.example:8123");
  EXPECT_EQ(o.lock.stale_ms, 10000);       // Meltano's lock_timeout_seconds default
  EXPECT_EQ(o.lock.retry_ms, 1000);        // Meltano's lock_retry_seconds default
  EXPECT_EQ(o.lock.timeout_ms, 21000);     // 2 x validity + retry
  EXPECT_EQ(o.transport.request_timeout_ms, 30000);
  EXPECT_EQ(o.mutation_timeout_ms, 60000);
  EXPECT_EQ(o.history_days, kDefaultHistoryDays);
  EXPECT_EQ(o.history_versions, kDefaultHistoryVersions);
  EXPECT_EQ(o.cluster.quorum_timeout_ms, kDefaultQuorumTimeoutMs);
  EXPECT_EQ(o.cluster.quorum_busy_ms, kDefaultQuorumBusyMs);
  EXPECT_EQ(o.cluster.ddl_timeout_s, kDefaultDdlTimeoutS);
  EXPECT_EQ(o.host_down_ms, kDefaultHostDownMs);
  EXPECT_FALSE(o.python_locks);
  EXPECT_FALSE(o.linger_locks);  // this host declared no background timers
  EXPECT_EQ(s->connect_timeout_ms, 5000);
  for (size_t i = 0; i < kSettingsCount; ++i) {
    const std::string key = kSettings[i].key;
    ASSERT_TRUE(s->origin.count(key)) << key;
    if (key != "uri" && key != "host" && key != "port" && key != "user" && key != "database") {
      EXPECT_EQ(s->origin.at(key), "default") << key;
    }
  }
  EXPECT_EQ(s->origin.at("uri"), "the uri setting");
  EXPECT_EQ(s->origin.at("user"), "the uri setting");
}

TEST(SettingsTest, ValuesBeatTheEnvironmentAndTheWaitFollowsTheValidity) {
  absl::StatusOr<Settings> s = ResolveSettings(
      Api({{"uri", kUri}, {"lock_timeout_seconds", "2.5"}},
          {{"MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS", "99"}, {"MELTANO_STATE_BACKEND_LOCK_RETRY_SECONDS", "0.25"}}));
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->store.lock.stale_ms, 2500);
  EXPECT_EQ(s->store.lock.retry_ms, 250);
  EXPECT_EQ(s->store.lock.timeout_ms, 2 * 2500 + 250);
  EXPECT_EQ(s->origin.at("lock_timeout_seconds"), "the lock_timeout_seconds setting");
  EXPECT_EQ(s->origin.at("lock_retry_seconds"), "MELTANO_STATE_BACKEND_LOCK_RETRY_SECONDS");
  EXPECT_EQ(s->origin.at("lock_wait_seconds"), "default");
}

TEST(SettingsTest, OriginsAreNamedAsEachKindOfHostNamesThem) {
  struct Case {
    SettingsFrom from;
    const char* key;
    const char* want;
  };
  static const Case kCases[] = {
      {SettingsFrom::kCli, "lock_timeout_seconds", "--stale-lock flag"},
      {SettingsFrom::kCli, "lock_wait_seconds", "--lock-timeout flag"},
      {SettingsFrom::kMeltano, "lock_timeout_seconds", "state_backend.lock_timeout_seconds"},
      {SettingsFrom::kMeltano, "history_days", "state_backend.clickhouse.history_days"},
      {SettingsFrom::kApi, "history_days", "the history_days setting"},
  };
  for (const Case& c : kCases) {
    SettingsSources src = Api({{"uri", kUri}, {c.key, "3"}});
    src.from = c.from;
    absl::StatusOr<Settings> s = ResolveSettings(src);
    ASSERT_THAT(s, IsOk());
    EXPECT_EQ(s->origin.at(c.key), c.want);
  }
}

TEST(SettingsTest, BadValuesNameWhereTheyCameFrom) {
  struct Case {
    const char* name;
    std::map<std::string, std::string> values;
    std::map<std::string, std::string> env;
    const char* error;
  };
  const Case kCases[] = {
      {"validity below the floor", {{"lock_timeout_seconds", "0.5"}}, {},
       "the lock_timeout_seconds setting is \"0.5\", which is not a number of seconds from 1"},
      {"not a number", {{"lock_retry_seconds", "soon"}}, {}, "the lock_retry_seconds setting is \"soon\""},
      {"negative wait", {}, {{"MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS", "-1"}},
       "MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_WAIT_SECONDS is \"-1\""},
      {"history days not whole", {{"history_days", "1.5"}}, {}, "not a whole number from 0 to 1000000"},
      {"bad boolean", {{"python_locks", "maybe"}}, {}, "which is not a boolean"},
      {"unknown key", {{"colour", "blue"}}, {}, "unknown setting \"colour\"; the settings are uri, host"},
      {"renamed key", {{"stale_lock", "30"}}, {}, "\"stale_lock\" is now called \"lock_timeout_seconds\""},
      {"renamed wait", {{"lock_timeout", "5"}}, {}, "is now called \"lock_wait_seconds\""},
      {"a year at most", {{"request_timeout_seconds", "1e9"}}, {}, "to a year"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    std::map<std::string, std::string> values = c.values;
    values["uri"] = kUri;
    EXPECT_THAT(ResolveSettings(Api(values, c.env)), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)));
  }
}

TEST(SettingsTest, MeltanosOwnSettingsWeDoNotKnowAreNotOurs) {
  SettingsSources src = Api({{"uri", kUri}, {"some_future_setting", "1"}});
  EXPECT_THAT(ResolveSettings(src), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("some_future_setting")));
  src.from = SettingsFrom::kMeltano;
  EXPECT_THAT(ResolveSettings(src), IsOk());
}

TEST(SettingsTest, LingeringFollowsWhatTheHostCanDo) {
  SettingsSources src = Api({{"uri", kUri}});
  src.host = {true, true};
  ASSERT_TRUE(ResolveSettings(src)->store.linger_locks);
  src.host = {true, false};
  EXPECT_FALSE(ResolveSettings(src)->store.linger_locks);
  src.values["linger_locks"] = "false";
  src.host = {true, true};
  EXPECT_FALSE(ResolveSettings(src)->store.linger_locks);
  // Where the runtime cannot keep a lock lingering, it never does.
  src.values["linger_locks"] = "true";
  src.host = {false, false};
  EXPECT_FALSE(ResolveSettings(src)->store.linger_locks);
}

TEST(SettingsTest, ChdbUris) {
  absl::StatusOr<Settings> s = ResolveSettings(Api({{"uri", "chdb:///var/lib/meltano/st%20ate?table=t2"}}));
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->chdb_path, "/var/lib/meltano/st ate");
  EXPECT_EQ(s->store.schema, "meltano");
  EXPECT_EQ(s->store.table, "t2");
  EXPECT_EQ(s->store.endpoint, "chdb:/var/lib/meltano/st ate");
  s = ResolveSettings(Api({{"uri", "chdb:///d?table=t2"}, {"table", "t3"}}));
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->store.table, "t3");  // the setting beats the URI's query
  struct Case {
    const char* uri;
    const char* error;
  };
  static const Case kCases[] = {
      {"chdb://relative/dir", "must start with '/'"},
      {"chdb:///d?colour=red", "expected schema and table"},
      {"chdb:///d#x", "no '#' fragment"},
      {"chdb:///d?table=bad-name", "table"},
  };
  for (const Case& c : kCases) {
    EXPECT_THAT(ResolveSettings(Api({{"uri", c.uri}})), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)))
        << c.uri;
  }
}

TEST(SettingsTest, TheSameSettingGivenTwoWays) {
  // A granular setting beats the URI's component; the URI beats the environment.
  absl::StatusOr<Settings> s = ResolveSettings(
      Api({{"uri", "clickhouse://alice@db.example:8123/analytics?schema=from_uri"}, {"schema", "from_value"}},
          {{"MELTANO_STATE_BACKEND_CLICKHOUSE_TABLE", "from_env"}, {"CLICKHOUSE_TABLE", "generic"}}));
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->store.schema, "from_value");
  EXPECT_EQ(s->origin.at("schema"), "the schema setting");
  EXPECT_EQ(s->store.table, "from_env");
  EXPECT_EQ(s->origin.at("table"), "MELTANO_STATE_BACKEND_CLICKHOUSE_TABLE");
}

TEST(SettingsTest, NoMessageHoldsThePassword) {
  absl::StatusOr<Settings> s =
      ResolveSettings(Api({{"uri", "clickhouse://alice:Sup3rSecret@db.example:8123/analytics"}, {"port", "Sup3rSecret"}}));
  ASSERT_THAT(s, Not(IsOk()));
  EXPECT_THAT(std::string(s.status().message()), Not(HasSubstr("Sup3rSecret")));
  s = ResolveSettings(Api({{"password", "Sup3rSecret"}, {"uri", kUri}, {"lock_retry_seconds", "x"}}));
  ASSERT_THAT(s, Not(IsOk()));
  EXPECT_THAT(std::string(s.status().message()), Not(HasSubstr("Sup3rSecret")));
}

// A password echoed in an error (a value typed into the wrong setting) is
// hidden however the message escapes it, and whole when one password holds
// another.
TEST(SettingsTest, APasswordIsHiddenEscapedAndWholeWhenOneHoldsAnother) {
  const std::string tricky = "pa\"ss\\w\tord";
  absl::StatusOr<Settings> s = ResolveSettings(Api({{"password", tricky}, {"uri", kUri}, {"port", tricky}}));
  ASSERT_THAT(s, Not(IsOk()));
  const std::string message(s.status().message());
  EXPECT_THAT(message, Not(HasSubstr(tricky)));
  EXPECT_THAT(message, Not(HasSubstr(absl::CHexEscape(tricky))));
  EXPECT_THAT(message, HasSubstr("***"));
  s = ResolveSettings(Api({{"password", "xsecretx"}, {"uri", kUri}, {"port", "xsecretx"}},
                          {{"CLICKHOUSE_PASSWORD", "secret"}}));
  ASSERT_THAT(s, Not(IsOk()));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("\"***\""));
  EXPECT_THAT(std::string(s.status().message()), Not(HasSubstr("x***x")));
}

// Counts are whole numbers within their bounds; durations keep fractions.
TEST(SettingsTest, CountsRefuseFractionsAndTooLargeValuesDurationsKeepFractions) {
  for (const char* bad : {"2.5", "3e1", "-1", "1000001", " 2"}) {
    absl::StatusOr<Settings> s = ResolveSettings(Api({{"uri", kUri}, {"history_versions", bad}}));
    EXPECT_THAT(s, Not(IsOk())) << bad;
    if (!s.ok()) EXPECT_THAT(std::string(s.status().message()), HasSubstr("not a whole number")) << bad;
  }
  absl::StatusOr<Settings> s = ResolveSettings(Api({{"uri", kUri}, {"history_versions", "1000000"}}));
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->store.history_versions, 1000000);
  s = ResolveSettings(Api({{"uri", kUri}, {"lock_retry_seconds", "1.5"}, {"lock_timeout_seconds", "10.25"}}));
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->store.lock.retry_ms, 1500);
  EXPECT_EQ(s->store.lock.stale_ms, 10250);
}

TEST(SettingsTest, SecretsGivenAreEveryPasswordWhereverGiven) {
  SettingsSources src;
  src.values = {{"password", "flagpw"}, {"uri", "clickhouse://a:uri%40pw@h:8123/db"}};
  src.env = {{"MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD", "envpw"},
             {"CLICKHOUSE_PASSWORD", "genericpw"},
             {"MELTANO_STATE_BACKEND_URI", "clickhouse://a:envuripw@h:8123/db"},
             {"MELTANO_STATE_BACKEND_CLICKHOUSE_USER", "not-a-secret"}};
  std::vector<std::string> got = SecretsGiven(src);
  std::sort(got.begin(), got.end());
  // A percent-encoded password both decoded and as written.
  EXPECT_EQ(got, (std::vector<std::string>{"envpw", "envuripw", "flagpw", "genericpw", "uri%40pw", "uri@pw"}));
  // Inputs that do not resolve still give their secrets.
  src.values = {{"uri", "clickhouse://a:uripw@h:notaport/db"}, {"port", "x"}};
  src.env.clear();
  EXPECT_EQ(SecretsGiven(src), std::vector<std::string>{"uripw"});
  src.values = {{"password", "pw"}, {"lock_retry_seconds", "x"}};
  EXPECT_FALSE(ResolveSettings(src).ok());
  EXPECT_EQ(SecretsGiven(src), std::vector<std::string>{"pw"});
}

TEST(SettingsTest, DefaultTexts) {
  EXPECT_EQ(DefaultText(*FindSetting("lock_timeout_seconds")), "10");
  EXPECT_EQ(DefaultText(*FindSetting("lock_wait_seconds")), "2 x lock_timeout_seconds + lock_retry_seconds");
  EXPECT_EQ(DefaultText(*FindSetting("history_days")), "30");
  EXPECT_EQ(DefaultText(*FindSetting("host")), "localhost");
}

}  // namespace
}  // namespace chstate
