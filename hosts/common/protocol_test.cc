// The shared host protocol: documents in and out, the one-op driver, config
// and store options from JSON. Driven with scripted answers, no server.
#include "hosts/common/protocol.h"

#include <string>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate::protocol {
namespace {

using ::chstate::testing::IsOk;
using ::chstate::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

const Inputs kIn{1000, std::string(32, '\x11')};

std::string Hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

std::string Answer(const std::string& body, int status = 200) {
  return Dump(json{{"response", {{"transport_ok", true}, {"http_status", status}, {"body_hex", Hex(body)}}}});
}

std::unique_ptr<Store> MakeStore(StoreOptions o = {}) {
  absl::StatusOr<std::unique_ptr<Store>> s = Store::Create(o);
  EXPECT_THAT(s, IsOk());
  return std::move(*s);
}

TEST(OpDriver, GetRunsVersionThenStateAndReportsTheState) {
  auto store = MakeStore();
  OpDriver d(store.get());
  // A state id with a NUL, a newline and invalid UTF-8 crosses as hex.
  const std::string id("dev:\0\n\xff", 7);
  json a = d.Start(Dump(json{{"op", "get"}, {"state_id_hex", Hex(id)}}), kIn);
  ASSERT_TRUE(a.contains("request")) << a;
  EXPECT_EQ(a["request"]["purpose"], "select_version");
  EXPECT_TRUE(d.busy());
  a = d.Feed(Answer("18.16.1\t1\n"), kIn);
  ASSERT_TRUE(a.contains("request")) << a;
  EXPECT_EQ(a["request"]["purpose"], "get_state");
  EXPECT_TRUE(a["request"]["idempotent"].get<bool>());
  a = d.Feed(Answer("\\N\t{\"singer_state\":{\"x\":1}}\n"), kIn);
  ASSERT_TRUE(a.contains("done")) << a;
  EXPECT_FALSE(d.busy());
  EXPECT_EQ(a["done"]["state"]["state_id_hex"], Hex(id));
  EXPECT_EQ(a["done"]["state"]["partial"], json::object());
  EXPECT_EQ(a["done"]["state"]["completed"]["singer_state"]["x"], 1);
  EXPECT_EQ(a["done"]["dialect"], "clickhouse18");
  EXPECT_EQ(a["done"]["server_version"], "18.16.1");
}

TEST(OpDriver, ExportPageReturnsStatesAndWhetherMoreFollow) {
  auto store = MakeStore();
  OpDriver d(store.get());
  json a = d.Start(Dump(json{{"op", "export_page"}, {"pattern", "dev:*"}, {"after_hex", Hex("dev:a")}, {"limit", 2}}),
                   kIn);
  a = d.Feed(Answer("18.16.1\t1\n"), kIn);
  ASSERT_EQ(a["request"]["purpose"], "sample_state_ids") << a;  // the page boundaries
  a = d.Feed(Answer(""), kIn);
  ASSERT_EQ(a["request"]["purpose"], "export_states") << a;
  const std::string sql = a["request"]["sql"];
  EXPECT_THAT(sql, HasSubstr("state_id > 'dev:a'"));
  EXPECT_THAT(sql, HasSubstr("LIMIT 2"));
  a = d.Feed(Answer("dev:b\t{\"p\":1}\t\\N\ndev:c\t\\N\t{\"singer_state\":{}}\n"), kIn);
  ASSERT_TRUE(a.contains("done")) << a;
  ASSERT_EQ(a["done"]["states"].size(), 2u);
  EXPECT_EQ(a["done"]["states"][0]["state_id_hex"], Hex("dev:b"));
  EXPECT_EQ(a["done"]["states"][0]["partial"]["p"], 1);
  EXPECT_EQ(a["done"]["states"][1]["completed"], json::parse(R"({"singer_state":{}})"));
  EXPECT_TRUE(a["done"]["more"].get<bool>());
  // Other ops' documents carry no export fields.
  d.Start(R"({"op":"get","state_id_hex":"6161"})", kIn);
  a = d.Feed(Answer(""), kIn);
  EXPECT_FALSE(a["done"].contains("states")) << a;
  // A bad limit is refused before anything is sent.
  a = d.Start(R"({"op":"export_page","limit":0})", kIn);
  EXPECT_EQ(a["failed"]["code"], "INVALID_ARGUMENT") << a;
}

TEST(OpDriver, ImportWritesOneInsertAndRefusesABadEntryFirst) {
  auto store = MakeStore();
  OpDriver d(store.get());
  json states = json::array({{{"state_id_hex", Hex("a")}, {"completed", {{"singer_state", 1}}}},
                             {{"state_id_hex", Hex("b")}, {"partial", {{"x", 2}}}, {"completed", nullptr}}});
  json a = d.Start(Dump(json{{"op", "import"}, {"states", states}}), kIn);
  a = d.Feed(Answer("18.16.1\t1\n"), kIn);
  ASSERT_EQ(a["request"]["purpose"], "insert_states") << a;
  EXPECT_THAT(a["request"]["sql"].get<std::string>(),
              HasSubstr("('a', NULL, '{\"singer_state\":1}'), ('b', '{\"x\":2}', NULL)"));
  EXPECT_FALSE(a["request"]["idempotent"].get<bool>());
  a = d.Feed(Answer(""), kIn);
  ASSERT_TRUE(a.contains("done")) << a;
  EXPECT_EQ(a["done"]["count"], 2);
  for (const char* bad : {R"({"op":"import"})", R"({"op":"import","states":[{"state_id_hex":"61"},7]})",
                          R"({"op":"import","states":[{"state_id_hex":"61","completed":[1]}]})",
                          R"({"op":"import","states":[{"state_id_hex":"61"},{"state_id_hex":"61"}]})"}) {
    a = d.Start(bad, kIn);
    ASSERT_TRUE(a.contains("failed")) << bad << " -> " << a;
    EXPECT_EQ(a["failed"]["code"], "INVALID_ARGUMENT") << bad;
  }
  a = d.Start(R"({"op":"import","states":[{"state_id_hex":"61"},{"state_id_hex":"62","partial":7}]})", kIn);
  EXPECT_THAT(a["failed"]["message"].get<std::string>(), HasSubstr("import entry 2 (state id \"b\"): "));
}

TEST(OpDriver, MergedAsksForTheViewATapGets) {
  auto store = MakeStore();
  OpDriver d(store.get());
  const std::string body = "{\"singer_state\":{\"b\":{\"y\":2},\"l\":[3]}}\t"
                           "{\"singer_state\":{\"a\":1,\"b\":{\"x\":1},\"l\":[1,2]}}\n";
  d.Start(R"({"op":"get","state_id_hex":"6161","merged":true})", kIn);
  d.Feed(Answer("18.16.1\t1\n"), kIn);
  json a = d.Feed(Answer(body), kIn);
  ASSERT_TRUE(a.contains("done")) << a;
  ASSERT_EQ(a["done"]["state"]["partial"]["singer_state"]["b"]["y"], 2) << a;  // the columns as read
  // Objects merge recursively, lists are replaced.
  EXPECT_EQ(a["done"]["state"]["merged"],
            json::parse(R"({"singer_state":{"a":1,"b":{"x":1,"y":2},"l":[3]}})"));
  // Without the flag (and on the store's next op) the document is as before.
  d.Start(R"({"op":"get","state_id_hex":"6161"})", kIn);
  a = d.Feed(Answer(body), kIn);
  ASSERT_TRUE(a.contains("done")) << a;
  EXPECT_FALSE(a["done"]["state"].contains("merged")) << a;
  a = d.Start(R"({"op":"get","state_id_hex":"6161","merged":"yes"})", kIn);
  ASSERT_TRUE(a.contains("failed")) << a;
  EXPECT_EQ(a["failed"]["code"], "INVALID_ARGUMENT");
  EXPECT_THAT(a["failed"]["message"].get<std::string>(), HasSubstr("\"merged\" must be true or false"));
  EXPECT_FALSE(d.busy());
}

TEST(OpDriver, AbsentStateIsNull) {
  auto store = MakeStore();
  OpDriver d(store.get());
  d.Start(R"({"op":"get","state_id_hex":"6161"})", kIn);
  d.Feed(Answer("18.16.1\t1\n"), kIn);
  json a = d.Feed(Answer(""), kIn);
  ASSERT_TRUE(a.contains("done")) << a;
  EXPECT_TRUE(a["done"]["state"].is_null());
}

TEST(OpDriver, TransportFailureOfAReadIsResentThenUnavailable) {
  auto store = MakeStore();
  OpDriver d(store.get());
  json a = d.Start(R"({"op":"get","state_id_hex":"6161"})", kIn);
  ASSERT_EQ(a["request"]["attempt"], 1) << a;
  const char* refused = R"j({"response":{"transport_ok":false,"transport_error":"connection refused (h:1)",
                                         "maybe_delivered":false}})j";
  // The core, not the host, resends: a wait, then the same request again.
  Inputs in = kIn;
  for (int attempt = 2; attempt <= 3; ++attempt) {
    a = d.Feed(refused, in);
    ASSERT_EQ(a, json({{"wait_ms", 100 << (attempt - 2)}}));
    // Woken a millisecond early (a coarse sleep): the rest of the wait.
    in.now_ms += (100 << (attempt - 2)) - 1;
    a = d.Feed(R"({"timer":true})", in);
    ASSERT_EQ(a, json({{"wait_ms", 1}}));
    in.now_ms += 1;
    a = d.Feed(R"({"timer":true})", in);
    ASSERT_EQ(a["request"]["purpose"], "select_version") << a;
    ASSERT_EQ(a["request"]["attempt"], attempt) << a;
  }
  a = d.Feed(refused, in);
  ASSERT_TRUE(a.contains("failed")) << a;
  EXPECT_EQ(a["failed"]["code"], "UNAVAILABLE");
  EXPECT_THAT(a["failed"]["message"].get<std::string>(), HasSubstr("connection refused"));
}

TEST(OpDriver, ServerErrorCodeComesFromTheBody) {
  auto store = MakeStore();
  OpDriver d(store.get());
  d.Start(R"({"op":"ping"})", kIn);
  json a = d.Feed(Answer("Code: 516, e.displayText() = DB::Exception: chstate: Authentication failed\n", 403), kIn);
  ASSERT_TRUE(a.contains("failed")) << a;
  EXPECT_EQ(a["failed"]["code"], "UNAUTHENTICATED");
}

TEST(OpDriver, NowAndRandomOverridesReachTheTask) {
  // acquire_lock with a scripted random source: the lock id is made from it.
  auto store = MakeStore();
  OpDriver d(store.get());
  const std::string random_hex(64, 'a');
  json a = d.Start(Dump(json{{"op", "acquire_lock"}, {"state_id_hex", "6161"}, {"now_ms", 5}}), kIn);
  ASSERT_TRUE(a.contains("request")) << a;
  json answer = json::parse(Answer("18.16.1\t1\n"));
  answer["random_hex"] = random_hex;
  a = d.Feed(Dump(answer), kIn);
  ASSERT_TRUE(a.contains("request")) << a;
  EXPECT_EQ(a["request"]["purpose"], "create_lock");
  EXPECT_THAT(a["request"]["sql"].get<std::string>(), HasSubstr("aaaaaaaa"));
}

struct BadInput {
  const char* name;
  const char* op;      // started first
  const char* answer;  // then fed ("" = none)
  const char* code;
  const char* message;
};

TEST(OpDriver, MalformedDocumentsEndTheOpWithAClearError) {
  static const BadInput kCases[] = {
      {"not json", "not json", "", "INVALID_ARGUMENT", "not valid JSON"},
      {"not an object", "[1]", "", "INVALID_ARGUMENT", "not a JSON object"},
      {"no op", "{}", "", "INVALID_ARGUMENT", "\"op\""},
      {"unknown op", R"({"op":"frobnicate"})", "", "INVALID_ARGUMENT", "unknown op \"frobnicate\""},
      {"odd hex", R"({"op":"get","state_id_hex":"616"})", "", "INVALID_ARGUMENT", "odd number"},
      {"not hex", R"({"op":"get","state_id_hex":"zz"})", "", "INVALID_ARGUMENT", "not hex"},
      {"empty id", R"({"op":"get","state_id_hex":""})", "", "INVALID_ARGUMENT", "empty"},
      {"set without state", R"({"op":"set","state_id_hex":"61"})", "", "INVALID_ARGUMENT", "\"state\""},
      {"bad side", R"({"op":"set","state_id_hex":"61","state":{"completed":[1]}})", "", "INVALID_ARGUMENT",
       "completed"},
      {"release without lock id", R"({"op":"release_lock","state_id_hex":"61"})", "", "INVALID_ARGUMENT",
       "lock_id"},
      {"release of a lock never held", R"({"op":"release_lock","state_id_hex":"61","lock_id":"x"})", "",
       "FAILED_PRECONDITION", "does not hold"},
      {"bad now", R"({"op":"ping","now_ms":"soon"})", "", "INVALID_ARGUMENT", "now_ms"},
      {"answer not json", R"({"op":"ping"})", "{", "INVALID_ARGUMENT", "not valid JSON"},
      {"answer without response", R"({"op":"ping"})", R"({"timer":true})", "INVALID_ARGUMENT",
       "{\"response\": {...}}"},
      {"answer without status", R"({"op":"ping"})", R"({"response":{}})", "INVALID_ARGUMENT", "http_status"},
      {"bad body hex", R"({"op":"ping"})", R"({"response":{"http_status":200,"body_hex":"x"}})",
       "INVALID_ARGUMENT", "body_hex"},
      {"bad transport_ok", R"({"op":"ping"})", R"({"response":{"transport_ok":1,"http_status":200}})",
       "INVALID_ARGUMENT", "transport_ok"},
  };
  for (const BadInput& c : kCases) {
    auto store = MakeStore();
    OpDriver d(store.get());
    json a = d.Start(c.op, kIn);
    if (c.answer[0] != '\0') {
      ASSERT_TRUE(a.contains("request")) << c.name << ": " << a;
      a = d.Feed(c.answer, kIn);
    }
    ASSERT_TRUE(a.contains("failed")) << c.name << ": " << a;
    EXPECT_EQ(a["failed"]["code"], c.code) << c.name;
    EXPECT_THAT(a["failed"]["message"].get<std::string>(), HasSubstr(c.message)) << c.name;
    EXPECT_FALSE(d.busy()) << c.name;
  }
}

TEST(OpDriver, FeedWithoutAnOpIsAMisuse) {
  auto store = MakeStore();
  OpDriver d(store.get());
  json a = d.Feed(R"({"timer":true})", kIn);
  ASSERT_TRUE(a.contains("failed"));
  EXPECT_EQ(a["failed"]["code"], "FAILED_PRECONDITION");
}

TEST(OpDriver, StartAbandonsAnUnfinishedOp) {
  auto store = MakeStore();
  OpDriver d(store.get());
  d.Start(R"({"op":"get","state_id_hex":"61"})", kIn);
  ASSERT_TRUE(d.busy());
  json a = d.Start(R"({"op":"ping"})", kIn);
  ASSERT_TRUE(a.contains("request"));
  EXPECT_EQ(a["request"]["purpose"], "select_version");
  a = d.Feed(Answer("26.9.2.1\t1\n"), kIn);
  ASSERT_TRUE(a.contains("done")) << a;
  EXPECT_EQ(a["done"]["dialect"], "modern");
}

TEST(OpDriver, WaitIsAnsweredByATimer) {
  // A held lock (not stale) makes the contender wait retry_ms.
  StoreOptions o;
  o.lock.retry_ms = 250;
  o.lock.timeout_ms = 1000;
  auto store = MakeStore(o);
  OpDriver d(store.get());
  d.Start(R"({"op":"acquire_lock","state_id_hex":"61"})", kIn);
  d.Feed(Answer("18.16.1\t1\n"), kIn);
  json a = d.Feed(Answer("Code: 57, e.displayText() = DB::Exception: Table already exists\n", 500), kIn);
  ASSERT_TRUE(a.contains("request")) << a;
  EXPECT_EQ(a["request"]["purpose"], "inspect_lock");
  a = d.Feed(Answer("other\t0\t100\t100\t300\n\t255\t100\t100\t0\n"), kIn);
  // It shows itself to the holder (linger_locks) before it waits.
  ASSERT_TRUE(a.contains("request")) << a;
  EXPECT_EQ(a["request"]["purpose"], "announce_lock_waiter");
  a = d.Feed(Answer(""), kIn);
  ASSERT_TRUE(a.contains("wait_ms")) << a;
  EXPECT_EQ(a["wait_ms"], 250);
  // A response where a timer is due is refused.
  json wrong = d.Feed(Answer(""), kIn);
  ASSERT_TRUE(wrong.contains("failed")) << wrong;
  EXPECT_THAT(wrong["failed"]["message"].get<std::string>(), HasSubstr("timer"));
}

TEST(StoreOptionsFromJson, ReadsEveryOptionAndRefusesUnknownOnes) {
  absl::StatusOr<StoreOptions> o = StoreOptionsFromJson(json::parse(
      R"({"schema":"s","table":"t","endpoint":"e","lock_timeout_ms":1,"lock_retry_ms":2,"stale_lock_ms":3,
          "mutation_timeout_ms":4,"cluster":"c1","zookeeper_path":"/zk/{shard}","replica":"r{replica}"})"));
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->cluster.name, "c1");
  EXPECT_EQ(o->cluster.zookeeper_path, "/zk/{shard}");
  EXPECT_EQ(o->cluster.replica, "r{replica}");
  EXPECT_FALSE(StoreOptionsFromJson(json::parse("{}"))->cluster.enabled());
  EXPECT_EQ(o->schema, "s");
  EXPECT_EQ(o->table, "t");
  EXPECT_EQ(o->endpoint, "e");
  EXPECT_EQ(o->lock.timeout_ms, 1);
  EXPECT_EQ(o->lock.retry_ms, 2);
  EXPECT_EQ(o->lock.stale_ms, 3);
  EXPECT_EQ(o->mutation_timeout_ms, 4);
  EXPECT_THAT(StoreOptionsFromJson(json::parse(R"({"shema":"s"})")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"shema\"")));
  EXPECT_THAT(StoreOptionsFromJson(json::parse(R"({"lock_timeout_ms":"10"})")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lock_timeout_ms")));
  EXPECT_THAT(StoreOptionsFromJson(json::parse(R"({"lock_retry_ms":-1})")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-negative")));
  EXPECT_THAT(StoreOptionsFromJson(json(nullptr)), IsOk());
}

TEST(StoreOptionsFromJson, ClusterSettings) {
  absl::StatusOr<StoreOptions> o = StoreOptionsFromJson(json::parse(
      R"({"cluster":"c","quorum":3,"quorum_timeout_ms":11,"quorum_busy_ms":12,"ddl_timeout_s":13,
          "host_down_ms":14})"));
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->cluster.quorum, 3);
  EXPECT_EQ(o->cluster.quorum_timeout_ms, 11);
  EXPECT_EQ(o->cluster.quorum_busy_ms, 12);
  EXPECT_EQ(o->cluster.ddl_timeout_s, 13);
  EXPECT_EQ(o->host_down_ms, 14);
  const StoreOptions d = *StoreOptionsFromJson(json::parse("{}"));
  EXPECT_EQ(d.cluster.quorum, kDefaultQuorum);
  EXPECT_EQ(d.cluster.quorum_busy_ms, kDefaultQuorumBusyMs);
  EXPECT_EQ(d.host_down_ms, kDefaultHostDownMs);
  for (const char* bad : {R"({"quorum":1})", R"({"quorum":"3"})", R"({"quorum":2.5})"}) {
    EXPECT_THAT(StoreOptionsFromJson(json::parse(bad)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 2"))) << bad;
  }
  EXPECT_THAT(StoreOptionsFromJson(json::parse(R"({"ddl_timeout_s":-1})")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-negative integer (seconds)")));
  EXPECT_THAT(StoreOptionsFromJson(json::parse(R"({"history_days":-1})")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-negative integer (days)")));
}

TEST(ResolveConfigJson, GranularFlagsOverrideTheUriComponentWise) {
  json out = ResolveConfigJson(R"({"flags":{"uri":"clickhouse://me:s3cret@db.internal:9000/analytics?schema=x",
                                   "port":8124,"secure":false,"table":"st","host":null,"user":""},"env":{}})");
  ASSERT_TRUE(out.contains("config")) << out;
  const json& c = out["config"];
  EXPECT_EQ(c["host"], "db.internal");
  EXPECT_EQ(c["port"], 8124);
  EXPECT_EQ(c["secure"], false);
  EXPECT_EQ(c["user"], "me");
  EXPECT_EQ(c["password"], "s3cret");
  EXPECT_EQ(c["database"], "analytics");
  EXPECT_EQ(c["schema"], "x");
  EXPECT_EQ(c["cluster"], "");  // one server unless a cluster is named
  EXPECT_EQ(c["replica"], "{replica}");
  EXPECT_EQ(c["table"], "st");
  EXPECT_EQ(c["origin"]["port"], "--port flag");
  EXPECT_EQ(c["origin"]["host"], "--uri flag");
  EXPECT_THAT(c["redacted_uri"].get<std::string>(), Not(HasSubstr("s3cret")));
  EXPECT_THAT(c["redacted_uri"].get<std::string>(), HasSubstr("me:***@db.internal:8124"));
}

TEST(ResolveConfigJson, ClusterSettingsComeFromTheUriAndTheirVariables) {
  json out = ResolveConfigJson(R"({"flags":{"uri":"clickhouse://u@h/d?cluster=c1"},
                                   "env":{"MELTANO_STATE_BACKEND_CLICKHOUSE_ZOOKEEPER_PATH":"/zk/{shard}"}})");
  ASSERT_TRUE(out.contains("config")) << out;
  EXPECT_EQ(out["config"]["cluster"], "c1");
  EXPECT_EQ(out["config"]["zookeeper_path"], "/zk/{shard}");
  EXPECT_EQ(out["config"]["replica"], "{replica}");
}

TEST(ResolveConfigJson, EnvironmentIsTheCoresLowerLayers) {
  json out = ResolveConfigJson(R"({"flags":{},"env":{"MELTANO_STATE_BACKEND_URI":"clickhouse://u@h/d",
                                   "CLICKHOUSE_PASSWORD":"pw"}})");
  ASSERT_TRUE(out.contains("config")) << out;
  EXPECT_EQ(out["config"]["host"], "h");
  EXPECT_EQ(out["config"]["password"], "pw");
  EXPECT_EQ(out["config"]["port"], 8123);
}

struct BadConfig {
  const char* sources;
  const char* message;
};

TEST(ResolveConfigJson, ErrorsNameTheProblemAndNeverThePassword) {
  static const BadConfig kCases[] = {
      {"nope", "not valid JSON"},
      {R"({"flags":{"hots":"x"}})", "unknown setting \"hots\""},
      {R"({"flagz":{}})", "unknown key \"flagz\""},
      {R"({"flags":{"port":1.5}})", "flags.port"},
      {R"({"flags":{"uri":"clickhouse://u:hunter2@h"}})", "database"},
      {R"({"flags":{"uri":"clickhouse://u:hunter2@h:99999/d"}})", "port"},
      {R"({"flags":{"uri":"clickhouse://:hunter2@h/d"}})", "user"},
      {R"({"flags":{"uri":"mysql://u:hunter2@h/d"}})", "scheme"},
      {R"({"flags":{"uri":"clickhouse://u@h/d","password":"hunter2","schema":"bad-name"}})", "schema"},
  };
  for (const BadConfig& c : kCases) {
    json out = ResolveConfigJson(c.sources);
    ASSERT_TRUE(out.contains("failed")) << c.sources << ": " << out;
    EXPECT_EQ(out["failed"]["code"], "INVALID_ARGUMENT") << c.sources;
    const std::string message = out["failed"]["message"].get<std::string>();
    EXPECT_THAT(message, HasSubstr(c.message)) << c.sources;
    EXPECT_THAT(Dump(out), Not(HasSubstr("hunter2"))) << c.sources;
  }
}

TEST(Documents, RequestJsonCarriesEveryField) {
  SqlRequest r;
  r.sql = "SELECT 1";
  r.url_params = {{"param_id", "a\\tb"}, {"wait_end_of_query", "1"}};
  r.idempotent = false;
  r.purpose = "insert_state";
  r.attempt = 2;
  r.timeout_ms = 1500;
  EXPECT_EQ(Dump(RequestJson(r)),
            R"({"request":{"attempt":2,"idempotent":false,"purpose":"insert_state","sql":"SELECT 1",)"
            R"("timeout_ms":1500,"url_params":[["param_id","a\\tb"],["wait_end_of_query","1"]]}})");
}

TEST(Documents, DumpNeverThrowsOnInvalidUtf8) {
  EXPECT_EQ(Dump(json("a\xff")), "\"a\xEF\xBF\xBD\"");
}

}  // namespace
}  // namespace chstate::protocol
