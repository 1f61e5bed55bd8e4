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
  json a = d.Start(Dump(json{{"op", "export"}, {"pattern", "dev:*"}, {"after_hex", Hex("dev:a")}, {"limit", 2}}),
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
  a = d.Start(R"({"op":"export","limit":0})", kIn);
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
  // acquire with a scripted random source: the lock id is made from it.
  auto store = MakeStore();
  OpDriver d(store.get());
  const std::string random_hex(64, 'a');
  json a = d.Start(Dump(json{{"op", "acquire"}, {"state_id_hex", "6161"}, {"now_ms", 5}}), kIn);
  ASSERT_TRUE(a.contains("request")) << a;
  json answer = json::parse(Answer("18.16.1\t1\n"));
  answer["random_hex"] = random_hex;
  a = d.Feed(Dump(answer), kIn);
  ASSERT_EQ(a["request"]["purpose"], "foreign_lock_rows") << a;
  answer = json::parse(Answer(""));
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
      {"unknown verb", R"({"op":"frobnicate"})", "", "INVALID_ARGUMENT", "unknown verb \"frobnicate\""},
      {"an op that is no verb any more", R"({"op":"set_locked","state_id_hex":"61"})", "", "INVALID_ARGUMENT",
       "the verbs are get, set"},
      {"odd hex", R"({"op":"get","state_id_hex":"616"})", "", "INVALID_ARGUMENT", "odd number"},
      {"not hex", R"({"op":"get","state_id_hex":"zz"})", "", "INVALID_ARGUMENT", "not hex"},
      {"empty id", R"({"op":"get","state_id_hex":""})", "", "INVALID_ARGUMENT", "empty"},
      {"set without state", R"({"op":"set","state_id_hex":"61"})", "", "INVALID_ARGUMENT", "set needs state"},
      {"bad side", R"({"op":"set","state_id_hex":"61","state":{"singer_state":{}},"partial":[1]})", "",
       "INVALID_ARGUMENT", "partial"},
      {"release without lock id", R"({"op":"release","state_id_hex":"61"})", "", "INVALID_ARGUMENT",
       "lock_id"},
      {"release of a lock never held", R"({"op":"release","state_id_hex":"61","lock_id":"x"})", "",
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

TEST(OpDriver, AnAnswerWithoutAnOpIsAMisuse) {
  auto store = MakeStore();
  OpDriver d(store.get());
  json a = d.Feed(Answer(""), kIn);
  ASSERT_TRUE(a.contains("failed"));
  EXPECT_EQ(a["failed"]["code"], "FAILED_PRECONDITION");
  EXPECT_THAT(a["failed"]["message"].get<std::string>(), HasSubstr("only {\"timer\": true}"));
}

// Acquires "a" (18.16, a 3 s validity): renewal due 1 s later.
json AcquireA(OpDriver& d, Inputs in) {
  json a = d.Start(R"({"op":"acquire","state_id_hex":"61"})", in);
  a = d.Feed(Answer("18.16.1\t1\n"), in);
  EXPECT_EQ(a["request"]["purpose"], "foreign_lock_rows") << a;
  a = d.Feed(Answer(""), in);
  EXPECT_EQ(a["request"]["purpose"], "create_lock") << a;
  return d.Feed(Answer(""), in);
}

TEST(OpDriver, TheIdleTimerRenewsAHeldLockWhileNoOpRuns) {
  StoreOptions o;
  o.lock.stale_ms = 3000;
  auto store = MakeStore(o);
  OpDriver d(store.get());
  json a = AcquireA(d, kIn);
  ASSERT_TRUE(a.contains("done")) << a;
  ASSERT_EQ(a["done"]["next_timeout_ms"], kIn.now_ms + 1000);
  // Early: nothing to do, and when to come back.
  a = d.Feed(R"({"timer":true})", {kIn.now_ms + 500, kIn.random});
  EXPECT_EQ(a, json::parse(R"({"idle":{"next_timeout_ms":2000}})"));
  // Due: the renewal's requests, answered as usual, then idle again.
  Inputs later{kIn.now_ms + 1000, kIn.random};
  a = d.Feed(R"({"timer":true})", later);
  ASSERT_EQ(a["request"]["purpose"], "renew_lock") << a;
  a = d.Feed(Answer(""), later);
  ASSERT_EQ(a["request"]["purpose"], "inspect_lock") << a;
  a = d.Feed(Answer(std::string(32, '1') + "\t0\t1\t2\t3\n\t255\t1\t2\t0\n"), later);
  ASSERT_TRUE(a.contains("idle")) << a;
  EXPECT_EQ(a["idle"]["next_timeout_ms"], later.now_ms + 1000);
  EXPECT_TRUE(store->LeaseValid("a", later.now_ms + 2500));  // renewed: the lease runs from now
  EXPECT_FALSE(d.busy());
  // A renewal that finds the lock taken over is a failure the host hears of,
  // and the scope's release then says the scope was not exclusive.
  Inputs lost{later.now_ms + 1000, kIn.random};
  a = d.Feed(R"({"timer":true})", lost);
  a = d.Feed(Answer(""), lost);
  a = d.Feed(Answer(std::string(32, 'f') + "\t0\t1\t2\t3\n\t255\t1\t2\t0\n"), lost);
  ASSERT_TRUE(a.contains("failed")) << a;
  EXPECT_EQ(a["failed"]["code"], "ABORTED");
  a = d.Start(Dump(json{{"op", "release"}, {"state_id_hex", "61"}, {"lock_id", std::string(32, '1')}}), lost);
  ASSERT_TRUE(a.contains("failed")) << a;
  EXPECT_THAT(a["failed"]["message"].get<std::string>(), HasSubstr("was lost while held"));
  EXPECT_EQ(a["failed"]["code"], "ABORTED");
}

TEST(OpDriver, CloseReleasesWhatTheStoreHolds) {
  auto store = MakeStore();
  OpDriver d(store.get());
  ASSERT_TRUE(AcquireA(d, kIn).contains("done"));
  json a = d.Start(R"({"close":true})", kIn);
  ASSERT_EQ(a["request"]["purpose"], "inspect_lock") << a;
  a = d.Feed(Answer(std::string(32, '1') + "\t0\t1\t2\t3\n\t255\t1\t2\t0\n"), kIn);
  ASSERT_EQ(a["request"]["purpose"], "drop_lock") << a;
  a = d.Feed(Answer(""), kIn);
  ASSERT_TRUE(a.contains("done")) << a;
  EXPECT_EQ(a["done"]["count"], 1);
  EXPECT_TRUE(a["done"]["next_timeout_ms"].is_null());
  a = d.Start(R"({"close":true,"op":"get"})", kIn);
  EXPECT_EQ(a["failed"]["code"], "INVALID_ARGUMENT") << a;
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
  d.Start(R"({"op":"acquire","state_id_hex":"61"})", kIn);
  d.Feed(Answer("18.16.1\t1\n"), kIn);
  d.Feed(Answer(""), kIn);  // no Python backend's row
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

TEST(Settings, ADocumentOfRawValuesBecomesConnectionStoreAndOrigins) {
  json out = ResolveSettingsJson(R"({"values":{"uri":"clickhouse://me:s3cret@db.internal:9000/analytics?schema=x",
                                     "port":8124,"secure":false,"table":"st","host":null,"user":"",
                                     "lock_timeout_seconds":2.5,"python_locks":true},
                                     "env":{"MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_DAYS":"7"}})");
  ASSERT_TRUE(out.contains("settings")) << out;
  const json& c = out["settings"]["connection"];
  EXPECT_EQ(c["host"], "db.internal");
  EXPECT_EQ(c["port"], 8124);
  EXPECT_EQ(c["user"], "me");
  EXPECT_EQ(c["password"], "s3cret");  // for the transport
  EXPECT_EQ(c["endpoint"], "db.internal:8124");
  EXPECT_EQ(c["connect_timeout_ms"], 5000);
  EXPECT_THAT(c["redacted_uri"].get<std::string>(), HasSubstr("me:***@db.internal:8124"));
  const json& st = out["settings"]["store"];
  EXPECT_EQ(st["schema"], "x");
  EXPECT_EQ(st["table"], "st");
  EXPECT_EQ(st["lock_validity_ms"], 2500);
  EXPECT_EQ(st["lock_wait_ms"], 6000);
  EXPECT_EQ(st["history_days"], 7);
  EXPECT_EQ(st["python_locks"], true);
  EXPECT_EQ(out["settings"]["origin"]["port"], "the port setting");
  EXPECT_EQ(out["settings"]["origin"]["history_days"], "MELTANO_STATE_BACKEND_CLICKHOUSE_HISTORY_DAYS");
  EXPECT_EQ(out["settings"]["origin"]["host"], "the uri setting");
  // The password is in the connection only.
  json without = out;
  without["settings"]["connection"].erase("password");
  EXPECT_THAT(Dump(without), Not(HasSubstr("s3cret")));
}

TEST(Settings, OpeningAStoreFromSettingsAndTheHostsCapabilities) {
  absl::StatusOr<OpenedStore> opened =
      OpenStore(R"({"from":"meltano","values":{"uri":"clickhouse://u@h/d"},"host":{"timers":true,"exit_release":true}})");
  ASSERT_THAT(opened, IsOk());
  EXPECT_TRUE(opened->store->options().linger_locks);
  EXPECT_EQ(opened->settings.origin.at("host"), "state_backend.uri");
  EXPECT_THAT(OpenStore(R"({"values":{"uri":"clickhouse://u@h/d","lock_timeout_seconds":"0.2"}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the lock_timeout_seconds setting")));
}

TEST(Settings, ErrorsNameTheProblemAndNeverThePassword) {
  static const struct {
    const char* sources;
    const char* message;
  } kCases[] = {
      {"nope", "not valid JSON"},
      {R"({"values":{"hots":"x"}})", "unknown setting \"hots\""},
      {R"({"valuez":{}})", "unknown member \"valuez\""},
      {R"({"values":{"port":[1]}})", "values.port"},
      {R"({"from":"lua","values":{}})", "\"from\" must be"},
      {R"({"host":{"threads":true}})", "\"host\" must be"},
      {R"({"values":{"uri":"clickhouse://u:hunter2@h"}})", "database"},
      {R"({"values":{"uri":"clickhouse://u:hunter2@h:99999/d"}})", "port"},
      {R"({"values":{"uri":"mysql://u:hunter2@h/d"}})", "scheme"},
      {R"({"values":{"uri":"clickhouse://u@h/d","password":"hunter2","port":"hunter2"}})", "port"},
  };
  for (const auto& c : kCases) {
    json out = ResolveSettingsJson(c.sources);
    ASSERT_TRUE(out.contains("failed")) << c.sources << ": " << out;
    EXPECT_EQ(out["failed"]["code"], "INVALID_ARGUMENT") << c.sources;
    EXPECT_THAT(out["failed"]["message"].get<std::string>(), HasSubstr(c.message)) << c.sources;
    EXPECT_THAT(Dump(out), Not(HasSubstr("hunter2"))) << c.sources;
  }
}

TEST(Tables, TheVerbAndSettingTablesAreDocuments) {
  json verbs = VerbsJson();
  ASSERT_TRUE(verbs["verbs"].is_array());
  EXPECT_GE(verbs["verbs"].size(), 20u);
  json settings = SettingsTableJson();
  ASSERT_TRUE(settings["settings"].is_array());
  bool found = false;
  for (const json& row : settings["settings"]) {
    if (row["key"] == "lock_timeout_seconds") {
      found = true;
      EXPECT_EQ(row["default"], "10");
      EXPECT_EQ(row["meltano"], "state_backend.lock_timeout_seconds");
      EXPECT_EQ(row["cli_flag"], "--stale-lock");
    }
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(settings["renamed"]["stale_lock"], "lock_timeout_seconds");
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

namespace chstate::protocol {
namespace {

TEST(OpDriver, ActionsCarryTheDiagnosticsTheHostAskedFor) {
  absl::StatusOr<OpenedStore> opened = OpenStore(Dump(
      json{{"values", {{"uri", "clickhouse://me@127.0.0.1:8123/default"}}}, {"host", {{"diagnostics", "info"}}}}));
  ASSERT_THAT(opened, IsOk());
  OpDriver d(opened->store.get());
  json a = d.Start(Dump(json{{"op", "ping"}}), kIn);
  ASSERT_TRUE(a.contains("request")) << a;
  EXPECT_FALSE(a.contains("events")) << a;
  a = d.Feed(Dump(json{{"response", {{"transport_ok", false}, {"maybe_delivered", false},
                                     {"transport_error", "connection refused"}}}}),
             kIn);
  ASSERT_TRUE(a.contains("wait_ms")) << a;
  ASSERT_TRUE(a.contains("events")) << a;
  ASSERT_EQ(a["events"].size(), 1u) << a;
  EXPECT_EQ(a["events"][0]["kind"], "resent");
  EXPECT_EQ(a["events"][0]["level"], "info");
  EXPECT_EQ(a["events"][0]["numbers"]["attempt"], 2);
  EXPECT_THAT(a["events"][0]["message"].get<std::string>(), HasSubstr("connection refused"));
  // Taken once: the next document carries none.
  a = d.Feed(Dump(json{{"timer", true}}), kIn);
  EXPECT_FALSE(a.contains("events")) << a;
}

TEST(OpDriver, AStatementEventsLineShowsItsSql) {
  absl::StatusOr<OpenedStore> opened = OpenStore(Dump(
      json{{"values", {{"uri", "clickhouse://me@127.0.0.1:8123/default"}}}, {"host", {{"diagnostics", "debug"}}}}));
  ASSERT_THAT(opened, IsOk());
  OpDriver d(opened->store.get());
  json a = d.Start(Dump(json{{"op", "ping"}}), kIn);
  ASSERT_TRUE(a.contains("request")) << a;
  const std::string sql = a["request"]["sql"];
  a = d.Feed(Dump(json{{"response", {{"transport_ok", true}, {"http_status", 200}, {"body", "18.16.1\t0\n"}}}}), kIn);
  ASSERT_TRUE(a.contains("events")) << a;
  const json& e = a["events"][0];
  EXPECT_EQ(e["kind"], "statement");
  EXPECT_EQ(e["level"], "debug");
  // What a log shows: the message, then the statement.
  EXPECT_EQ(e["line"], e["message"].get<std::string>() + ": " + sql) << e;
  EXPECT_EQ(e["texts"]["sql"], sql);
}

TEST(OpDriver, NoDiagnosticsUnlessAskedAndABadLevelIsNamed) {
  absl::StatusOr<OpenedStore> opened =
      OpenStore(Dump(json{{"values", {{"uri", "clickhouse://me@127.0.0.1:8123/default"}}}}));
  ASSERT_THAT(opened, IsOk());
  OpDriver d(opened->store.get());
  d.Start(Dump(json{{"op", "ping"}}), kIn);
  json a = d.Feed(Dump(json{{"response", {{"transport_ok", false}, {"maybe_delivered", false},
                                          {"transport_error", "connection refused"}}}}),
                  kIn);
  EXPECT_FALSE(a.contains("events")) << a;
  EXPECT_THAT(OpenStore(Dump(json{{"values", {{"uri", "clickhouse://me@h/db"}}}, {"host", {{"diagnostics", "loud"}}}})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"diagnostics\"")));
}

}  // namespace
}  // namespace chstate::protocol
