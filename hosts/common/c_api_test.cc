// The C ABI through its C signatures only: ownership, NULL handling, one op
// driven to its end, and store creation errors.
#include "hosts/common/chstate.h"

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <nlohmann/json.hpp>

namespace {

// Live allocations made through operator new, program-wide: the library is
// linked into this test statically, so a store that is not released whole
// shows up here.
std::atomic<long> g_live_news{0};

}  // namespace

void* operator new(std::size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  ++g_live_news;
  return p;
}
void operator delete(void* p) noexcept {
  if (p == nullptr) return;
  --g_live_news;
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }

namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

const unsigned char kRandom[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                   1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

// Takes ownership of a returned string and parses it.
json Take(char* s) {
  EXPECT_NE(s, nullptr);
  if (s == nullptr) return json();
  json j = json::parse(s);
  chstate_string_free(s);
  return j;
}

// The ABI this test was written against. Bumping the version (an
// incompatible change of a signature or document) must update this test.
static_assert(CHSTATE_ABI_VERSION == 3, "the header's ABI version changed: review the ABI tests");

// The smallest settings a store opens with.
constexpr char kSettings[] = R"({"values":{"uri":"clickhouse://u@h:1/d"}})";

TEST(CApi, VersionIsThree) { EXPECT_EQ(chstate_abi_version(), 3); }

TEST(CApi, TheTablesAreDocuments) {
  json verbs = Take(chstate_verbs());
  ASSERT_TRUE(verbs["verbs"].is_array()) << verbs;
  EXPECT_EQ(verbs["verbs"][0]["name"], "get");
  json settings = Take(chstate_settings_table());
  ASSERT_TRUE(settings["settings"].is_array()) << settings;
  EXPECT_EQ(settings["settings"][0]["key"], "uri");
}

TEST(CApi, AStoreOpensFromRawSettingsAndSaysHowToConnect) {
  char* err = nullptr;
  chstate_store* s = chstate_store_new(R"({"values":{"uri":"clickhouse://u:pw@h:1/d","secure":"true"}})", &err);
  ASSERT_NE(s, nullptr) << (err ? err : "");
  json c = Take(chstate_store_settings(s));
  EXPECT_EQ(c["settings"]["connection"]["secure"], true);
  EXPECT_EQ(c["settings"]["connection"]["port"], 1);
  EXPECT_EQ(c["settings"]["connection"]["password"], "pw");
  EXPECT_EQ(c["settings"]["store"]["lock_validity_ms"], 10000);
  chstate_store_free(s);
  json r = Take(chstate_resolve_settings(R"({"values":{"uri":"clickhouse://u@h:1/d","history_days":"3"}})"));
  EXPECT_EQ(r["settings"]["store"]["history_days"], 3) << r;
}

TEST(CApi, DrivesAnOpToTheEnd) {
  char* err = nullptr;
  chstate_store* s = chstate_store_new(kSettings, &err);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(err, nullptr);
  json a = Take(chstate_op_start(s, R"({"op":"list","pattern":"dev:*"})", 5, kRandom, sizeof kRandom));
  ASSERT_EQ(a["request"]["purpose"], "select_version") << a;
  a = Take(chstate_op_feed(s, R"({"response":{"http_status":200,"body":"26.9.2.1\t1\n"}})", 6, kRandom,
                           sizeof kRandom));
  ASSERT_EQ(a["request"]["purpose"], "list_state_ids") << a;
  a = Take(chstate_op_feed(s, R"({"response":{"http_status":200,"body_hex":"6465763a6109310a"}})", 7, kRandom,
                           sizeof kRandom));
  ASSERT_TRUE(a.contains("done")) << a;
  EXPECT_EQ(a["done"]["state_ids_hex"], json::array({"6465763a61"}));
  chstate_store_free(s);
}

// One store's life: created, an op started and left unfinished, freed. The
// action string outlives the store: it belongs to the caller.
void AbandonedGet() {
  chstate_store* s = chstate_store_new(kSettings, nullptr);
  ASSERT_NE(s, nullptr);
  char* action = chstate_op_start(s, R"({"op":"get","state_id_hex":"61"})", 5, kRandom, sizeof kRandom);
  chstate_store_free(s);  // with the op unfinished
  ASSERT_NE(action, nullptr);
  json a = json::parse(action);
  EXPECT_EQ(a["request"]["purpose"], "select_version") << a;
  chstate_string_free(action);
}

// A store freed while it holds a lock in the middle of a `set` (the INSERT
// under the lock outstanding).
void AbandonedSetUnderTheLock() {
  chstate_store* s = chstate_store_new(kSettings, nullptr);
  ASSERT_NE(s, nullptr);
  json a = Take(chstate_op_start(s, R"({"op":"set","state_id_hex":"61","state":{"a":1},"force":true})", 5,
                                 kRandom, sizeof kRandom));
  ASSERT_EQ(a["request"]["purpose"], "select_version") << a;
  a = Take(chstate_op_feed(s, R"({"response":{"http_status":200,"body":"18.16.1\t1\n"}})", 6, kRandom,
                           sizeof kRandom));
  ASSERT_EQ(a["request"]["purpose"], "foreign_lock_rows") << a;
  a = Take(chstate_op_feed(s, R"({"response":{"http_status":200,"body":""}})", 7, kRandom, sizeof kRandom));
  ASSERT_EQ(a["request"]["purpose"], "create_lock") << a;
  a = Take(chstate_op_feed(s, R"({"response":{"http_status":200,"body":""}})", 7, kRandom, sizeof kRandom));
  ASSERT_EQ(a["request"]["purpose"], "insert_state") << a;
  chstate_store_free(s);
}

TEST(CApi, FreeingAStoreMidOperationReleasesEverything) {
  // Once each first: one-time statics (compiled patterns) are not leaks.
  AbandonedGet();
  AbandonedSetUnderTheLock();
  const long before = g_live_news.load();
  AbandonedGet();
  EXPECT_EQ(g_live_news.load(), before) << "a store freed with an unfinished op left allocations behind";
  AbandonedSetUnderTheLock();
  EXPECT_EQ(g_live_news.load(), before) << "a store freed while holding a lock left allocations behind";
}

TEST(CApi, FreeingNullIsANoOp) {
  const long before = g_live_news.load();
  chstate_store_free(nullptr);
  chstate_string_free(nullptr);
  EXPECT_EQ(g_live_news.load(), before);
  // And the library goes on working.
  chstate_store* s = chstate_store_new(kSettings, nullptr);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(Take(chstate_op_start(s, R"({"op":"get","state_id_hex":"61"})", 5, kRandom, sizeof kRandom))["request"]
               ["purpose"],
            "select_version");
  chstate_store_free(s);
}

// Starting an op abandons the unfinished one: the new op starts from its own
// first request, not from where the old one stood.
TEST(CApi, StartingAnOpAbandonsTheUnfinishedOne) {
  chstate_store* s = chstate_store_new(kSettings, nullptr);
  ASSERT_NE(s, nullptr);
  json a = Take(chstate_op_start(s, R"({"op":"get","state_id_hex":"61"})", 5, kRandom, sizeof kRandom));
  ASSERT_EQ(a["request"]["purpose"], "select_version") << a;
  a = Take(chstate_op_start(s, R"({"op":"list"})", 6, kRandom, sizeof kRandom));
  ASSERT_EQ(a["request"]["purpose"], "select_version") << a;
  a = Take(chstate_op_feed(s, R"({"response":{"http_status":200,"body":"26.9.2.1\t1\n"}})", 7, kRandom,
                           sizeof kRandom));
  EXPECT_EQ(a["request"]["purpose"], "list_state_ids") << a;
  chstate_store_free(s);
}

TEST(CApi, BadSettingsReturnNullAndAnError) {
  char* err = nullptr;
  EXPECT_EQ(chstate_store_new(R"({"values":{"uri":"clickhouse://u@h:1/d","schema":"no spaces"}})", &err), nullptr);
  json e = Take(err);
  EXPECT_EQ(e["failed"]["code"], "INVALID_ARGUMENT");
  EXPECT_THAT(e["failed"]["message"].get<std::string>(), HasSubstr("schema"));
  err = nullptr;
  EXPECT_EQ(chstate_store_new("{", &err), nullptr);
  EXPECT_EQ(Take(err)["failed"]["code"], "INVALID_ARGUMENT");
  EXPECT_EQ(chstate_store_new(R"({"values":{"tabel":"x"}})", nullptr), nullptr);  // no error wanted: no leak either
  err = nullptr;
  EXPECT_EQ(chstate_store_new(nullptr, &err), nullptr);
  EXPECT_EQ(Take(err)["failed"]["code"], "INVALID_ARGUMENT");
}

TEST(CApi, NullArgumentsAreErrorsNotCrashes) {
  EXPECT_EQ(Take(chstate_op_start(nullptr, "{}", 0, nullptr, 0))["failed"]["code"], "INVALID_ARGUMENT");
  chstate_store* s = chstate_store_new(kSettings, nullptr);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(Take(chstate_op_start(s, nullptr, 0, nullptr, 0))["failed"]["code"], "INVALID_ARGUMENT");
  EXPECT_EQ(Take(chstate_op_feed(s, nullptr, 0, nullptr, 0))["failed"]["code"], "INVALID_ARGUMENT");
  // While no op runs, a timer is the idle timer: nothing held, nothing due.
  EXPECT_TRUE(Take(chstate_op_feed(s, R"({"timer":true})", 0, nullptr, 0))["idle"]["next_timeout_ms"].is_null());
  EXPECT_EQ(Take(chstate_op_feed(s, R"({"response":{}})", 0, nullptr, 0))["failed"]["code"], "FAILED_PRECONDITION");
  EXPECT_EQ(Take(chstate_resolve_settings(nullptr))["failed"]["code"], "INVALID_ARGUMENT");
  EXPECT_EQ(Take(chstate_store_settings(nullptr))["failed"]["code"], "INVALID_ARGUMENT");
  chstate_store_free(s);
}

TEST(CApi, WritesNeedRandomBytes) {
  chstate_store* s = chstate_store_new(kSettings, nullptr);
  json a = Take(chstate_op_start(s, R"({"op":"set","state_id_hex":"61","state":{"a":1},"force":true})", 5,
                                 nullptr, 0));
  ASSERT_TRUE(a.contains("request"));
  a = Take(chstate_op_feed(s, R"({"response":{"http_status":200,"body":"18.16.1\t1\n"}})", 6, nullptr, 0));
  ASSERT_EQ(a["request"]["purpose"], "foreign_lock_rows") << a;
  a = Take(chstate_op_feed(s, R"({"response":{"http_status":200,"body":""}})", 6, nullptr, 0));
  ASSERT_TRUE(a.contains("failed")) << a;
  EXPECT_THAT(a["failed"]["message"].get<std::string>(), HasSubstr("random"));
  chstate_store_free(s);
}

// The *_bytes calls: an answer's body and an import document handed over as
// bytes, an export page's document handed back apart from the JSON.
TEST(CApi, BytesApartFromTheJson) {
  chstate_store* s = chstate_store_new(kSettings, nullptr);
  char* document = nullptr;
  size_t document_len = 99;
  json a = Take(chstate_op_start_bytes(s, R"({"op":"export","document":true})", nullptr, 0, 5, kRandom,
                                       sizeof kRandom, &document, &document_len));
  EXPECT_EQ(document, nullptr);
  // Answers by purpose, each body as bytes (a tab and a NUL-free JSON side).
  const std::string version = "18.16.1\t1\n";
  const std::string page = "dev:a\t\\N\t{\"b\":1}\n";
  for (int step = 0; step < 10 && a.contains("request"); ++step) {
    const std::string purpose = a["request"]["purpose"];
    const std::string* body = purpose == "select_version" ? &version : purpose == "export_states" ? &page : nullptr;
    const std::string empty;
    if (body == nullptr) body = &empty;  // the sample of ids: none, so one range to the end
    a = Take(chstate_op_feed_bytes(s, R"({"response":{"http_status":200}})",
                                   reinterpret_cast<const unsigned char*>(body->data()), body->size(), 6, kRandom,
                                   sizeof kRandom, &document, &document_len));
  }
  ASSERT_TRUE(a.contains("done")) << a;
  EXPECT_FALSE(a["done"].contains("document")) << a;
  EXPECT_EQ(a["done"]["document_bytes"], document_len);
  ASSERT_NE(document, nullptr);
  EXPECT_EQ(std::string(document, document_len), R"("dev:a": {"completed":{"b":1},"partial":{}})");
  EXPECT_EQ(document[document_len], '\0');
  chstate_string_free(document);

  // An import document apart: checked before anything is sent.
  const std::string bad = R"({"dev:a": {"completed": 1}})";
  a = Take(chstate_op_start_bytes(s, R"({"op":"import_document"})", reinterpret_cast<const unsigned char*>(bad.data()),
                                  bad.size(), 7, kRandom, sizeof kRandom, &document, &document_len));
  ASSERT_TRUE(a.contains("failed")) << a;
  EXPECT_THAT(a["failed"]["message"].get<std::string>(), HasSubstr("dev:a"));
  const std::string good = R"({"dev:a": {"completed": {"b": 2}, "partial": {}}})";
  a = Take(chstate_op_start_bytes(s, R"({"op":"import_document"})",
                                  reinterpret_cast<const unsigned char*>(good.data()), good.size(), 7, kRandom,
                                  sizeof kRandom, nullptr, nullptr));
  ASSERT_TRUE(a.contains("request")) << a;

  // Given twice: in the JSON and apart.
  a = Take(chstate_op_start_bytes(s, R"({"op":"import_document","document":"{}"})",
                                  reinterpret_cast<const unsigned char*>(good.data()), good.size(), 8, kRandom,
                                  sizeof kRandom, nullptr, nullptr));
  ASSERT_TRUE(a.contains("failed")) << a;
  EXPECT_THAT(a["failed"]["message"].get<std::string>(), HasSubstr("given twice"));
  a = Take(chstate_op_start_bytes(s, R"({"op":"ping"})", nullptr, 0, 9, kRandom, sizeof kRandom, nullptr, nullptr));
  ASSERT_TRUE(a.contains("request")) << a;
  a = Take(chstate_op_feed_bytes(s, R"({"response":{"http_status":200,"body":"18.16.1\t1\n"}})",
                                 reinterpret_cast<const unsigned char*>(version.data()), version.size(), 10, kRandom,
                                 sizeof kRandom, nullptr, nullptr));
  ASSERT_TRUE(a.contains("failed")) << a;
  EXPECT_THAT(a["failed"]["message"].get<std::string>(), HasSubstr("given twice"));
  EXPECT_EQ(a["failed"]["code"], "INVALID_ARGUMENT");

  EXPECT_EQ(Take(chstate_op_start_bytes(nullptr, "{}", nullptr, 0, 0, nullptr, 0, &document, nullptr))["failed"]["code"],
            "INVALID_ARGUMENT");
  EXPECT_EQ(document, nullptr);
  EXPECT_EQ(Take(chstate_op_feed_bytes(s, nullptr, nullptr, 0, 0, nullptr, 0, nullptr, nullptr))["failed"]["code"],
            "INVALID_ARGUMENT");
  chstate_store_free(s);
}

}  // namespace
