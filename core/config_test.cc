// Tests for clickhouse:// URI parsing, the settings precedence order, and
// keeping the password out of every message and redacted URI.
#include "core/config.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chstate {
namespace {

using ::chstate::testing::IsOk;
using ::chstate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AllOfArray;
using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Matcher;
using ::testing::Not;

// Every error case that can carry a password carries this one, and no message
// may contain any of it.
constexpr char kSecret[] = "s3cr3tPW";

// Only the components that are set, in a fixed order, so a table row reads
// like the URI it came from.
std::string Describe(const UriParts& p) {
  std::vector<std::string> items;
  auto add = [&items](const char* key, const std::optional<std::string>& value) {
    if (value.has_value()) items.push_back(std::string(key) + "=" + *value);
  };
  add("user", p.user);
  add("password", p.password);
  add("host", p.host);
  if (p.port.has_value()) items.push_back("port=" + std::to_string(*p.port));
  add("database", p.database);
  if (p.secure.has_value()) items.push_back(std::string("secure=") + (*p.secure ? "true" : "false"));
  add("schema", p.schema);
  add("table", p.table);
  add("ca_file", p.ca_file);
  add("cluster", p.cluster);
  add("zookeeper_path", p.zookeeper_path);
  add("replica", p.replica);
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : " ") + item;
  return out;
}

std::vector<Matcher<std::string>> ContainsAll(const std::vector<std::string>& parts) {
  std::vector<Matcher<std::string>> matchers;
  for (const std::string& part : parts) matchers.push_back(HasSubstr(part));
  return matchers;
}

Matcher<std::string> MessageWith(const std::vector<std::string>& parts) {
  return AllOf(AllOfArray(ContainsAll(parts)), Not(HasSubstr("s3cr3t")), Not(HasSubstr("PW")));
}

TEST(ParseClickHouseUriTest, Parses) {
  struct Case {
    const char* name;
    const char* uri;
    const char* want;
  };
  static const Case kCases[] = {
      {"plain", "clickhouse://me:pw@db.internal:8123/analytics",
       "user=me password=pw host=db.internal port=8123 database=analytics"},
      {"no port", "clickhouse://me:pw@h/db", "user=me password=pw host=h database=db"},
      {"no userinfo", "clickhouse://h:9000/db", "host=h port=9000 database=db"},
      {"user only", "clickhouse://me@h/db", "user=me host=h database=db"},
      {"empty password is unset", "clickhouse://me:@h/db", "user=me host=h database=db"},
      {"no database", "clickhouse://me@h", "user=me host=h"},
      {"empty path", "clickhouse://me@h/", "user=me host=h"},
      {"no host", "clickhouse:///db", "database=db"},
      {"port without host", "clickhouse://me@:9000/db", "user=me port=9000 database=db"},
      {"percent-decoding", "clickhouse://m%40e:p%40ss%3Aword@h/my%20db",
       "user=m@e password=p@ss:word host=h database=my db"},
      {"escaped slash in database", "clickhouse://me@h/a%2Fb", "user=me host=h database=a/b"},
      {"raw colon in password", "clickhouse://me:pa:ss@h/db", "user=me password=pa:ss host=h database=db"},
      {"raw @ in password", "clickhouse://me:p@ss@h/db", "user=me password=p@ss host=h database=db"},
      {"leading zeros in port", "clickhouse://h:08123/db", "host=h port=8123 database=db"},
      {"highest port", "clickhouse://h:65535/db", "host=h port=65535 database=db"},
      {"IPv6 loopback", "clickhouse://u@[::1]:8123/db", "user=u host=::1 port=8123 database=db"},
      {"IPv6 with port", "clickhouse://u@[2001:db8::1]:9000/db", "user=u host=2001:db8::1 port=9000 database=db"},
      {"IPv6 without port", "clickhouse://[::1]/db", "host=::1 database=db"},
      {"secure=true", "clickhouse://u@h/db?secure=true", "user=u host=h database=db secure=true"},
      {"secure=1", "clickhouse://u@h/db?secure=1", "user=u host=h database=db secure=true"},
      {"secure=false", "clickhouse://u@h/db?secure=false", "user=u host=h database=db secure=false"},
      {"secure=ON", "clickhouse://u@h/db?secure=ON", "user=u host=h database=db secure=true"},
      {"clickhouses scheme", "clickhouses://u@h/db", "user=u host=h database=db secure=true"},
      {"https scheme", "https://u@h/db", "user=u host=h database=db secure=true"},
      {"http scheme", "http://u@h/db", "user=u host=h database=db secure=false"},
      {"upper-case scheme", "CLICKHOUSE://u@h/db", "user=u host=h database=db"},
      {"https agrees with secure", "https://u@h/db?secure=1", "user=u host=h database=db secure=true"},
      {"schema and table", "clickhouse://u@h/db?schema=meltano_prod&table=st",
       "user=u host=h database=db schema=meltano_prod table=st"},
      {"ca_file raw", "clickhouse://u@h/db?ca_file=/etc/ssl/ca.pem", "user=u host=h database=db ca_file=/etc/ssl/ca.pem"},
      {"ca_file escaped", "clickhouse://u@h/db?ca_file=%2Fetc%2Fca%20x.pem",
       "user=u host=h database=db ca_file=/etc/ca x.pem"},
      {"empty query values are unset", "clickhouse://u@h/db?schema=&secure=&", "user=u host=h database=db"},
      {"cluster", "clickhouse://u@h/db?cluster=prod_ch", "user=u host=h database=db cluster=prod_ch"},
      {"cluster with zookeeper path and replica escaped",
       "clickhouse://u@h/db?cluster=c&zookeeper_path=%2Fch%2F%7Bshard%7D&replica=%7Breplica%7D-b",
       "user=u host=h database=db cluster=c zookeeper_path=/ch/{shard} replica={replica}-b"},
      {"surrounding whitespace", "  clickhouse://u@h/db\n", "user=u host=h database=db"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    ASSERT_OK_AND_ASSIGN(UriParts parts, ParseClickHouseUri(c.uri));
    EXPECT_EQ(Describe(parts), c.want);
  }
}

TEST(ParseClickHouseUriTest, RejectsWithoutLeakingThePassword) {
  struct Case {
    const char* name;
    std::string uri;
    std::vector<std::string> message_has;
  };
  const std::string pw = kSecret;
  static const Case kCases[] = {
      {"wrong scheme", "mysql://me:" + pw + "@h/db", {"scheme \"mysql\"", "clickhouse://"}},
      {"missing ://", "me:" + pw + "@h/db", {"://", "clickhouse://user:password@host:port/database"}},
      {"single slash", "clickhouse:/me:" + pw + "@h/db", {"://"}},
      {"userinfo where the scheme goes", "me:" + pw + "://h/db", {"scheme", "clickhouse://"}},
      {"port 0", "clickhouse://me:" + pw + "@h:0/db", {"port \"0\"", "1 to 65535"}},
      {"port 65536", "clickhouse://me:" + pw + "@h:65536/db", {"port \"65536\"", "1 to 65535"}},
      {"port 80a", "clickhouse://me:" + pw + "@h:80a/db", {"port \"80a\"", "1 to 65535"}},
      {"port with sign", "clickhouse://me:" + pw + "@h:+80/db", {"port", "1 to 65535"}},
      {"empty port", "clickhouse://me:" + pw + "@h:/db", {"port", "1 to 65535"}},
      {"bad escape in password", "clickhouse://me:" + pw + "%zz@h/db", {"password", "percent-escape", "%25"}},
      {"truncated escape in password", "clickhouse://me:" + pw + "%4@h/db", {"password", "percent-escape"}},
      {"bad escape in user", "clickhouse://m%e:" + pw + "@h/db", {"user", "percent-escape"}},
      {"truncated escape in database", "clickhouse://me:" + pw + "@h/db%4", {"database", "percent-escape"}},
      {"bad escape in query value", "clickhouse://me:" + pw + "@h/db?schema=a%g1", {"schema", "percent-escape"}},
      {"unknown query key", "clickhouse://me:" + pw + "@h/db?foo=1",
       {"\"foo\"", "secure, schema, table, ca_file, cluster, zookeeper_path, replica and quorum"}},
      {"bad secure value", "clickhouse://me:" + pw + "@h/db?secure=maybe",
       {"secure=\"maybe\"", "secure=true or secure=false"}},
      {"duplicate query key", "clickhouse://me:" + pw + "@h/db?table=a&table=b", {"\"table\"", "more than once"}},
      {"scheme contradicts secure", "https://me:" + pw + "@h/db?secure=false", {"secure=false", "clickhouse://"}},
      {"unclosed bracket", "clickhouse://me:" + pw + "@[::1:8123/db", {"no closing ']'", "[::1]"}},
      {"bracketed name", "clickhouse://me:" + pw + "@[host]/db", {"\"host\"", "IPv6"}},
      {"text after bracket", "clickhouse://me:" + pw + "@[::1]x/db", {"\"x\"", ":port"}},
      {"IPv6 without brackets", "clickhouse://me:" + pw + "@::1/db", {"brackets", "[::1]"}},
      {"bad host character", "clickhouse://me:" + pw + "@h%20x/db", {"host \"h%20x\"", "letters, digits"}},
      {"database with slash", "clickhouse://me:" + pw + "@h/db/x", {"single database name", "%2F"}},
      {"database with trailing slash", "clickhouse://me:" + pw + "@h/db/", {"single database name"}},
      {"raw slash in password", "clickhouse://me:s3cr3t/PW@h/db", {"'@' after the host", "%2F"}},
      {"raw question mark in password", "clickhouse://me:s3cr3t?PW@h/db", {"'@' after the host", "%3F"}},
      {"raw hash in password", "clickhouse://me:s3cr3t#PW@h/db", {"'@' after the host", "%23"}},
      {"raw digits-then-? password", "clickhouse://me:123?s3cr3tPW@h/db", {"'@' after the host"}},
      {"fragment", "clickhouse://me:" + pw + "@h/db#top", {"fragment", "%23"}},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(ParseClickHouseUri(c.uri), StatusIs(absl::StatusCode::kInvalidArgument, MessageWith(c.message_has)));
  }
}

TEST(ParseBoolTest, AcceptsTheUsualSpellings) {
  struct Case {
    const char* text;
    std::optional<bool> want;
  };
  static const Case kCases[] = {
      {"true", true},  {"TRUE", true},  {"1", true},     {"yes", true},       {"On", true},
      {"false", false}, {"False", false}, {"0", false},  {"no", false},       {"OFF", false},
      {"", std::nullopt}, {"2", std::nullopt}, {"y", std::nullopt}, {" true", std::nullopt}, {"truee", std::nullopt},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.text);
    EXPECT_EQ(ParseBool(c.text), c.want);
  }
}

// "value (origin)", so one string checks both where a setting came from and
// what it became.
std::string Setting(const ConnectionConfig& cfg, const std::string& key) {
  std::string value;
  if (key == "host") value = cfg.host;
  if (key == "port") value = std::to_string(cfg.port);
  if (key == "secure") value = cfg.secure ? "true" : "false";
  if (key == "user") value = cfg.user;
  if (key == "password") value = cfg.password;
  if (key == "database") value = cfg.database;
  if (key == "schema") value = cfg.schema;
  if (key == "table") value = cfg.table;
  if (key == "ca_file") value = cfg.ca_file;
  if (key == "cluster") value = cfg.cluster;
  if (key == "zookeeper_path") value = cfg.zookeeper_path;
  if (key == "replica") value = cfg.replica;
  if (key == "quorum") value = std::to_string(cfg.quorum);
  auto it = cfg.origin.find(key);
  return value + " (" + (it == cfg.origin.end() ? "<no origin>" : it->second) + ")";
}

// Rows add to this so each need not repeat the two settings without defaults.
const std::map<std::string, std::string>& BaseEnv() {
  static const auto* const kEnv =
      new std::map<std::string, std::string>{{"CLICKHOUSE_USER", "u0"}, {"CLICKHOUSE_DATABASE", "d0"}};
  return *kEnv;
}

ConfigSources Sources(const std::map<std::string, std::string>& flags,
                      const std::map<std::string, std::string>& env) {
  ConfigSources src;
  src.flags = flags;
  src.env = BaseEnv();
  for (const auto& [name, value] : env) src.env[name] = value;
  return src;
}

TEST(ResolveConfigTest, Precedence) {
  struct Case {
    const char* name;
    std::map<std::string, std::string> flags;
    std::map<std::string, std::string> env;
    std::map<std::string, std::string> want;  // key -> "value (origin)"
  };
  static const Case kCases[] = {
      {"defaults",
       {},
       {},
       {{"host", "localhost (default)"},
        {"port", "8123 (default)"},
        {"secure", "false (default)"},
        {"user", "u0 (CLICKHOUSE_USER)"},
        {"password", " (default)"},
        {"database", "d0 (CLICKHOUSE_DATABASE)"},
        {"schema", "meltano (default)"},
        {"table", "state (default)"},
        {"ca_file", " (default)"}}},
      {"schema and table from the generic variables",
       {},
       {{"CLICKHOUSE_SCHEMA", "gs"}, {"CLICKHOUSE_TABLE", "gt"}},
       {{"schema", "gs (CLICKHOUSE_SCHEMA)"}, {"table", "gt (CLICKHOUSE_TABLE)"}}},
      {"the generic schema and table are the lowest level",
       {{"uri", "clickhouse://u@h/d?table=ut"}},
       {{"CLICKHOUSE_SCHEMA", "gs"}, {"CLICKHOUSE_TABLE", "gt"}, {"MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA", "ms"}},
       {{"schema", "ms (MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA)"}, {"table", "ut (--uri flag)"}}},
      {"granular flag beats --uri",
       {{"host", "fh"}, {"port", "9100"}, {"user", "fu"}, {"uri", "clickhouse://uu:up@uh:9001/ud?table=ut"}},
       {},
       {{"host", "fh (--host flag)"},
        {"port", "9100 (--port flag)"},
        {"user", "fu (--user flag)"},
        {"password", "up (--uri flag)"},
        {"database", "ud (--uri flag)"},
        {"table", "ut (--uri flag)"}}},
      {"--uri beats MELTANO_STATE_BACKEND_CLICKHOUSE_*",
       {{"uri", "clickhouse://uu:up@uh:9001/ud?schema=us"}},
       {{"MELTANO_STATE_BACKEND_CLICKHOUSE_HOST", "eh"},
        {"MELTANO_STATE_BACKEND_CLICKHOUSE_PORT", "9002"},
        {"MELTANO_STATE_BACKEND_CLICKHOUSE_USER", "eu"},
        {"MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD", "ep"},
        {"MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA", "es"},
        {"MELTANO_STATE_BACKEND_CLICKHOUSE_TABLE", "et"}},
       {{"host", "uh (--uri flag)"},
        {"port", "9001 (--uri flag)"},
        {"user", "uu (--uri flag)"},
        {"password", "up (--uri flag)"},
        {"schema", "us (--uri flag)"},
        {"table", "et (MELTANO_STATE_BACKEND_CLICKHOUSE_TABLE)"}}},
      {"MELTANO_STATE_BACKEND_CLICKHOUSE_* beats MELTANO_STATE_BACKEND_URI",
       {},
       {{"MELTANO_STATE_BACKEND_CLICKHOUSE_HOST", "eh"},
        {"MELTANO_STATE_BACKEND_CLICKHOUSE_DATABASE", "ed"},
        {"MELTANO_STATE_BACKEND_CLICKHOUSE_TABLE", "et"},
        {"MELTANO_STATE_BACKEND_CLICKHOUSE_CA_FILE", "/e/ca.pem"},
        {"MELTANO_STATE_BACKEND_URI", "clickhouse://vu@vh:9003/vd?table=vt&ca_file=/v/ca.pem"}},
       {{"host", "eh (MELTANO_STATE_BACKEND_CLICKHOUSE_HOST)"},
        {"port", "9003 (MELTANO_STATE_BACKEND_URI)"},
        {"user", "vu (MELTANO_STATE_BACKEND_URI)"},
        {"database", "ed (MELTANO_STATE_BACKEND_CLICKHOUSE_DATABASE)"},
        {"table", "et (MELTANO_STATE_BACKEND_CLICKHOUSE_TABLE)"},
        {"ca_file", "/e/ca.pem (MELTANO_STATE_BACKEND_CLICKHOUSE_CA_FILE)"}}},
      {"MELTANO_STATE_BACKEND_URI beats CLICKHOUSE_*",
       {},
       {{"MELTANO_STATE_BACKEND_URI", "clickhouse://vu:vp@vh/vd"},
        {"CLICKHOUSE_HOST", "ch"},
        {"CLICKHOUSE_PASSWORD", "cp"},
        {"CLICKHOUSE_PORT", "9004"}},
       {{"host", "vh (MELTANO_STATE_BACKEND_URI)"},
        {"port", "9004 (CLICKHOUSE_PORT)"},
        {"user", "vu (MELTANO_STATE_BACKEND_URI)"},
        {"password", "vp (MELTANO_STATE_BACKEND_URI)"},
        {"database", "vd (MELTANO_STATE_BACKEND_URI)"}}},
      {"CLICKHOUSE_* beats defaults",
       {},
       {{"CLICKHOUSE_HOST", "ch"}, {"CLICKHOUSE_PORT", "9005"}, {"CLICKHOUSE_PASSWORD", "cp"},
        {"CLICKHOUSE_SECURE", "true"}},
       {{"host", "ch (CLICKHOUSE_HOST)"},
        {"port", "9005 (CLICKHOUSE_PORT)"},
        {"password", "cp (CLICKHOUSE_PASSWORD)"},
        {"secure", "true (CLICKHOUSE_SECURE)"}}},
      {"cluster settings: flag beats --uri beats MELTANO_STATE_BACKEND_CLICKHOUSE_*, defaults are the macros",
       {{"cluster", "fc"}, {"uri", "clickhouse://uu@uh/ud?cluster=uc&replica=ur"}},
       {{"MELTANO_STATE_BACKEND_CLICKHOUSE_CLUSTER", "ec"}, {"MELTANO_STATE_BACKEND_CLICKHOUSE_REPLICA", "er"},
        {"CLICKHOUSE_CLUSTER", "cc"}},
       {{"cluster", "fc (--cluster flag)"},
        {"replica", "ur (--uri flag)"},
        {"zookeeper_path", "/clickhouse/tables/{shard} (default)"}}},
      {"cluster from the environment only; CLICKHOUSE_CLUSTER is not read",
       {},
       {{"MELTANO_STATE_BACKEND_CLICKHOUSE_ZOOKEEPER_PATH", "/z/{shard}"}, {"CLICKHOUSE_CLUSTER", "cc"}},
       {{"cluster", " (default)"},
        {"zookeeper_path", "/z/{shard} (MELTANO_STATE_BACKEND_CLICKHOUSE_ZOOKEEPER_PATH)"},
        {"replica", "{replica} (default)"}}},
      {"CLICKHOUSE_CA_FILE is not read (not in the generic set)",
       {},
       {{"CLICKHOUSE_CA_FILE", "/c/ca.pem"}},
       {{"ca_file", " (default)"}}},
      {"MELTANO_STATE_BACKEND_CLICKHOUSE_* beats CLICKHOUSE_*",
       {},
       {{"MELTANO_STATE_BACKEND_CLICKHOUSE_USER", "eu"}, {"MELTANO_STATE_BACKEND_CLICKHOUSE_SECURE", "no"},
        {"CLICKHOUSE_SECURE", "yes"}},
       {{"user", "eu (MELTANO_STATE_BACKEND_CLICKHOUSE_USER)"},
        {"secure", "false (MELTANO_STATE_BACKEND_CLICKHOUSE_SECURE)"},
        {"port", "8123 (default)"}}},
      {"empty values are unset",
       {{"host", ""}, {"uri", ""}, {"user", ""}},
       {{"MELTANO_STATE_BACKEND_CLICKHOUSE_HOST", ""},
        {"MELTANO_STATE_BACKEND_URI", ""},
        {"MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA", ""},
        {"CLICKHOUSE_HOST", "ch"}},
       {{"host", "ch (CLICKHOUSE_HOST)"}, {"user", "u0 (CLICKHOUSE_USER)"}, {"schema", "meltano (default)"}}},
      {"systemdb URI is another backend's",
       {},
       {{"MELTANO_STATE_BACKEND_URI", "systemdb"}},
       {{"host", "localhost (default)"}, {"user", "u0 (CLICKHOUSE_USER)"}}},
      {"s3 URI is another backend's",
       {},
       {{"MELTANO_STATE_BACKEND_URI", "s3://me:key@bucket/prefix"}},
       {{"host", "localhost (default)"}, {"user", "u0 (CLICKHOUSE_USER)"}}},
      {"upper-case scheme in MELTANO_STATE_BACKEND_URI",
       {},
       {{"MELTANO_STATE_BACKEND_URI", "ClickHouse://vu@vh/vd"}},
       {{"host", "vh (MELTANO_STATE_BACKEND_URI)"}}},
      {"secure from --secure gives port 8443",
       {{"secure", "true"}},
       {},
       {{"secure", "true (--secure flag)"}, {"port", "8443 (default)"}}},
      {"secure from clickhouses:// in --uri gives port 8443",
       {{"uri", "clickhouses://u@h/d"}},
       {},
       {{"secure", "true (--uri flag)"}, {"port", "8443 (default)"}}},
      {"secure from MELTANO_STATE_BACKEND_CLICKHOUSE_SECURE gives port 8443",
       {},
       {{"MELTANO_STATE_BACKEND_CLICKHOUSE_SECURE", "yes"}},
       {{"secure", "true (MELTANO_STATE_BACKEND_CLICKHOUSE_SECURE)"}, {"port", "8443 (default)"}}},
      {"secure from https:// in MELTANO_STATE_BACKEND_URI gives port 8443",
       {},
       {{"MELTANO_STATE_BACKEND_URI", "https://u@h/d"}},
       {{"secure", "true (MELTANO_STATE_BACKEND_URI)"}, {"port", "8443 (default)"}}},
      {"secure from CLICKHOUSE_SECURE gives port 8443",
       {},
       {{"CLICKHOUSE_SECURE", "1"}},
       {{"secure", "true (CLICKHOUSE_SECURE)"}, {"port", "8443 (default)"}}},
      {"explicit port beats the secure default",
       {{"secure", "true"}, {"port", "8123"}},
       {},
       {{"secure", "true (--secure flag)"}, {"port", "8123 (--port flag)"}}},
      {"lowest-layer port beats the secure default",
       {{"uri", "clickhouses://u@h/d"}},
       {{"CLICKHOUSE_PORT", "9440"}},
       {{"secure", "true (--uri flag)"}, {"port", "9440 (CLICKHOUSE_PORT)"}}},
      {"--secure=false beats clickhouses://",
       {{"secure", "false"}, {"uri", "clickhouses://u@h/d"}},
       {},
       {{"secure", "false (--secure flag)"}, {"port", "8123 (default)"}}},
      {"--uri beats MELTANO_STATE_BACKEND_URI per component",
       {{"uri", "clickhouse://uu@uh/ud"}},
       {{"MELTANO_STATE_BACKEND_URI", "clickhouse://vu:vp@vh:9006/vd?schema=vs"}},
       {{"host", "uh (--uri flag)"},
        {"port", "9006 (MELTANO_STATE_BACKEND_URI)"},
        {"password", "vp (MELTANO_STATE_BACKEND_URI)"},
        {"schema", "vs (MELTANO_STATE_BACKEND_URI)"}}},
      {"--ca-file flag", {{"ca_file", "/f/ca.pem"}}, {}, {{"ca_file", "/f/ca.pem (--ca-file flag)"}}},
      {"bracketed IPv6 host in a variable",
       {},
       {{"CLICKHOUSE_HOST", "[::1]"}},
       {{"host", "::1 (CLICKHOUSE_HOST)"}}},
      {"bare IPv6 host in a flag", {{"host", "2001:db8::2"}}, {}, {{"host", "2001:db8::2 (--host flag)"}}},
      {"quorum from the URI", {{"uri", "clickhouse://u@h/d?cluster=c&quorum=3"}}, {},
       {{"quorum", "3 (--uri flag)"}}},
      {"--quorum beats the Meltano variable", {{"quorum", "4"}, {"cluster", "c"}},
       {{"MELTANO_STATE_BACKEND_CLICKHOUSE_QUORUM", "3"}}, {{"quorum", "4 (--quorum flag)"}}},
      {"quorum default", {{"cluster", "c"}}, {}, {{"quorum", "2 (default)"}}},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    ASSERT_OK_AND_ASSIGN(ConnectionConfig cfg, ResolveConfig(Sources(c.flags, c.env)));
    for (const auto& [key, want] : c.want) {
      SCOPED_TRACE(key);
      EXPECT_EQ(Setting(cfg, key), want);
    }
  }
}

TEST(ResolveConfigTest, EverySettingGetsAnOrigin) {
  ASSERT_OK_AND_ASSIGN(ConnectionConfig cfg, ResolveConfig(Sources({}, {})));
  for (const char* key : kSettingKeys) {
    SCOPED_TRACE(key);
    EXPECT_EQ(cfg.origin.count(key), 1u);
  }
}

TEST(ResolveConfigTest, Rejects) {
  struct Case {
    const char* name;
    std::map<std::string, std::string> flags;
    std::map<std::string, std::string> env;
    std::vector<std::string> message_has;
  };
  const std::string pw = kSecret;
  static const Case kCases[] = {
      {"malformed --uri", {{"uri", "clickhouse://u:" + pw + "@h:0/d"}}, {}, {"--uri", "port", "1 to 65535"}},
      {"cluster name with a quote", {{"uri", "clickhouse://u@h/d?cluster=a%27b"}}, {}, {"cluster name", "--uri flag",
       "remote_servers"}},
      {"relative zookeeper path", {{"uri", "clickhouse://u@h/d"}, {"zookeeper_path", "ch/x"}}, {},
       {"zookeeper_path", "--zookeeper-path flag", "absolute"}},
      {"zookeeper path with a quote", {{"uri", "clickhouse://u@h/d"}},
       {{"MELTANO_STATE_BACKEND_CLICKHOUSE_ZOOKEEPER_PATH", "/a'b"}},
       {"zookeeper_path", "MELTANO_STATE_BACKEND_CLICKHOUSE_ZOOKEEPER_PATH"}},
      {"replica with a slash", {{"uri", "clickhouse://u@h/d?replica=a%2Fb"}}, {}, {"replica name", "--uri flag"}},
      {"foreign scheme in --uri", {{"uri", "mysql://u:" + pw + "@h/d"}}, {}, {"--uri", "scheme", "clickhouse://"}},
      {"--uri without ://", {{"uri", "u:" + pw + "@h/d"}}, {}, {"--uri", "://"}},
      {"malformed MELTANO_STATE_BACKEND_URI",
       {},
       {{"MELTANO_STATE_BACKEND_URI", "clickhouse://u:" + pw + "@h/d?foo=1"}},
       {"MELTANO_STATE_BACKEND_URI", "\"foo\""}},
      {"bad escape in MELTANO_STATE_BACKEND_URI password",
       {},
       {{"MELTANO_STATE_BACKEND_URI", "https://u:" + pw + "%zz@h/d"}},
       {"MELTANO_STATE_BACKEND_URI", "password", "percent-escape"}},
      {"malformed MELTANO_STATE_BACKEND_URI even when --uri is given",
       {{"uri", "clickhouse://u@h/d"}},
       {{"MELTANO_STATE_BACKEND_URI", "clickhouse://u:" + pw + "@[::1/d"}},
       {"MELTANO_STATE_BACKEND_URI", "]"}},
      {"--port not a number", {{"port", "80a"}}, {}, {"--port flag", "\"80a\"", "1 to 65535"}},
      {"MELTANO_STATE_BACKEND_CLICKHOUSE_PORT 0",
       {},
       {{"MELTANO_STATE_BACKEND_CLICKHOUSE_PORT", "0"}},
       {"MELTANO_STATE_BACKEND_CLICKHOUSE_PORT", "\"0\"", "1 to 65535"}},
      {"CLICKHOUSE_PORT too big", {}, {{"CLICKHOUSE_PORT", "65536"}}, {"CLICKHOUSE_PORT", "65536"}},
      {"--secure not a boolean", {{"secure", "maybe"}}, {}, {"--secure flag", "\"maybe\"", "true or false"}},
      {"CLICKHOUSE_SECURE not a boolean", {}, {{"CLICKHOUSE_SECURE", "2"}}, {"CLICKHOUSE_SECURE", "true or false"}},
      {"host with a port in it",
       {},
       {{"CLICKHOUSE_HOST", "db:9000"}},
       {"CLICKHOUSE_HOST", "\"db:9000\"", "port separately"}},
      {"host with a slash", {{"host", "h/x"}}, {}, {"--host flag", "not a host name"}},
      {"invalid schema with a backtick",
       {{"schema", "a`b"}},
       {},
       {"schema name", "letters, digits and underscores", "--schema flag"}},
      {"invalid schema starting with a digit",
       {},
       {{"MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA", "1abc"}},
       {"schema name", "\"1abc\"", "MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA"}},
      {"invalid table from a URI",
       {{"uri", "clickhouse://u:" + pw + "@h/d?table=x%3Bdrop"}},
       {},
       {"table name", "x;drop", "--uri flag"}},
      {"invalid table from a flag", {{"table", "x;drop"}}, {}, {"table name", "x;drop", "--table flag"}},
      {"table too long", {{"table", std::string(65, 't')}}, {}, {"table name", "65 bytes"}},
      {"quorum of one", {{"uri", "clickhouse://u:" + pw + "@h/d?cluster=c&quorum=1"}}, {},
       {"--uri flag", "\"1\"", "at least 2"}},
      {"quorum not a number", {{"quorum", "two"}, {"cluster", "c"}}, {}, {"--quorum flag", "\"two\"", "at least 2"}},
      {"quorum without a cluster", {{"quorum", "3"}}, {}, {"--quorum flag", "needs cluster mode"}},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    ConfigSources src = Sources(c.flags, c.env);
    src.env["CLICKHOUSE_PASSWORD"] = kSecret;
    EXPECT_THAT(ResolveConfig(src), StatusIs(absl::StatusCode::kInvalidArgument, MessageWith(c.message_has)));
  }
}

TEST(ResolveConfigTest, MissingUserOrDatabaseNamesEveryPlace) {
  struct Case {
    const char* name;
    std::map<std::string, std::string> flags;
    std::map<std::string, std::string> env;
    std::vector<std::string> message_has;
  };
  static const Case kCases[] = {
      {"no user anywhere",
       {{"database", "d"}, {"password", kSecret}},
       {},
       {"ClickHouse user is not set", "clickhouse://USER@host/database", "--user",
        "MELTANO_STATE_BACKEND_CLICKHOUSE_USER", "state_backend.clickhouse.user in meltano.yml", "CLICKHOUSE_USER"}},
      {"only empty users",
       {{"database", "d"}, {"user", ""}},
       {{"MELTANO_STATE_BACKEND_CLICKHOUSE_USER", ""}, {"CLICKHOUSE_USER", ""},
        {"MELTANO_STATE_BACKEND_URI", std::string("clickhouse://:") + kSecret + "@h/d"}},
       {"ClickHouse user is not set", "--user", "MELTANO_STATE_BACKEND_CLICKHOUSE_USER", "CLICKHOUSE_USER"}},
      {"no database anywhere",
       {{"uri", std::string("clickhouse://u:") + kSecret + "@h"}},
       {},
       {"ClickHouse database is not set", "clickhouse://user@host/DATABASE", "--database",
        "MELTANO_STATE_BACKEND_CLICKHOUSE_DATABASE", "state_backend.clickhouse.database in meltano.yml",
        "CLICKHOUSE_DATABASE"}},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    ConfigSources src;
    src.flags = c.flags;
    src.env = c.env;
    EXPECT_THAT(ResolveConfig(src), StatusIs(absl::StatusCode::kInvalidArgument, MessageWith(c.message_has)));
  }
}

ConnectionConfig Config(const std::string& user, const std::string& password, const std::string& host, int port,
                        bool secure, const std::string& database) {
  ConnectionConfig cfg;
  cfg.user = user;
  cfg.password = password;
  cfg.host = host;
  cfg.port = port;
  cfg.secure = secure;
  cfg.database = database;
  return cfg;
}

TEST(RedactedUriTest, HidesThePassword) {
  struct Case {
    const char* name;
    ConnectionConfig cfg;
    const char* want;
  };
  ConnectionConfig with_ca = Config("me", "", "h", 8123, false, "db");
  with_ca.ca_file = "/etc/ssl/ca.pem";
  ConnectionConfig custom_names = Config("me", kSecret, "h", 8123, false, "db");
  custom_names.schema = "meltano_prod";
  custom_names.table = "st";
  ConnectionConfig cluster = Config("me", "", "h", 8123, false, "db");
  cluster.cluster = "prod";
  ConnectionConfig cluster_paths = cluster;
  cluster_paths.zookeeper_path = "/ch/{shard}";
  cluster_paths.replica = "r-{replica}";
  const Case kCases[] = {
      {"cluster", cluster, "clickhouse://me@h:8123/db?secure=false&schema=meltano&table=state&cluster=prod"},
      {"cluster with paths", cluster_paths,
       "clickhouse://me@h:8123/db?secure=false&schema=meltano&table=state&cluster=prod"
       "&zookeeper_path=/ch/{shard}&replica=r-{replica}"},
      {"password shown as ***", Config("me", kSecret, "h", 8123, false, "db"),
       "clickhouse://me:***@h:8123/db?secure=false&schema=meltano&table=state"},
      {"no password", Config("me", "", "h", 8123, false, "db"),
       "clickhouse://me@h:8123/db?secure=false&schema=meltano&table=state"},
      {"password with URI syntax", Config("me", "p@ss:w/rd?#%", "h", 8123, false, "db"),
       "clickhouse://me:***@h:8123/db?secure=false&schema=meltano&table=state"},
      {"user and database escaped", Config("a@b c", kSecret, "h", 8443, true, "my db/x"),
       "clickhouse://a%40b%20c:***@h:8443/my%20db%2Fx?secure=true&schema=meltano&table=state"},
      {"IPv6 host in brackets", Config("me", kSecret, "2001:db8::1", 9000, true, "db"),
       "clickhouse://me:***@[2001:db8::1]:9000/db?secure=true&schema=meltano&table=state"},
      {"ca_file", with_ca, "clickhouse://me@h:8123/db?secure=false&schema=meltano&table=state&ca_file=/etc/ssl/ca.pem"},
      {"schema and table", custom_names, "clickhouse://me:***@h:8123/db?secure=false&schema=meltano_prod&table=st"},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const std::string redacted = c.cfg.RedactedUri();
    EXPECT_EQ(redacted, c.want);
    EXPECT_THAT(redacted, Not(HasSubstr(kSecret)));
    if (!c.cfg.password.empty()) {
      EXPECT_THAT(redacted, Not(HasSubstr(c.cfg.password)));
    }

    // The redacted form is itself a URI that means the same connection.
    ASSERT_OK_AND_ASSIGN(UriParts parts, ParseClickHouseUri(redacted));
    EXPECT_EQ(parts.user.value_or(""), c.cfg.user);
    EXPECT_EQ(parts.password.value_or(""), c.cfg.password.empty() ? "" : "***");
    EXPECT_EQ(parts.host.value_or(""), c.cfg.host);
    EXPECT_EQ(parts.port.value_or(0), c.cfg.port);
    EXPECT_EQ(parts.database.value_or(""), c.cfg.database);
    EXPECT_EQ(parts.secure.value_or(!c.cfg.secure), c.cfg.secure);
    EXPECT_EQ(parts.schema.value_or(""), c.cfg.schema);
    EXPECT_EQ(parts.table.value_or(""), c.cfg.table);
    EXPECT_EQ(parts.ca_file.value_or(""), c.cfg.ca_file);
    EXPECT_EQ(parts.cluster.value_or(""), c.cfg.cluster);
    EXPECT_EQ(parts.zookeeper_path.value_or(kDefaultZooKeeperPath), c.cfg.zookeeper_path);
    EXPECT_EQ(parts.replica.value_or(kDefaultReplica), c.cfg.replica);
  }
}

TEST(RedactedUriTest, ResolvedFromAUriWithAPassword) {
  ConfigSources src;
  src.flags["uri"] = std::string("clickhouses://me:") + kSecret + "@db.internal/analytics?table=st";
  ASSERT_OK_AND_ASSIGN(ConnectionConfig cfg, ResolveConfig(src));
  EXPECT_EQ(cfg.password, kSecret);
  EXPECT_THAT(cfg.RedactedUri(),
              Eq("clickhouse://me:***@db.internal:8443/analytics?secure=true&schema=meltano&table=st"));
}

TEST(ResolveConfigTest, HeaderExample) {
  ConfigSources src;
  src.flags = {{"uri", "clickhouse://me:pw@db.internal/analytics"}, {"port", "9123"}};
  src.env = {{"MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA", "meltano_prod"}};
  absl::StatusOr<ConnectionConfig> cfg = ResolveConfig(src);
  ASSERT_THAT(cfg, IsOk());
  EXPECT_EQ(cfg->host, "db.internal");
  EXPECT_EQ(cfg->port, 9123);
  EXPECT_EQ(cfg->schema, "meltano_prod");
  EXPECT_EQ(cfg->origin.at("schema"), "MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA");
}

}  // namespace
}  // namespace chstate

namespace chstate {
namespace {

ConfigSources WithFlags(std::map<std::string, std::string> flags) {
  ConfigSources src;
  src.flags = std::move(flags);
  return src;
}

TEST(HostListTest, UriListsEveryHostWithItsPort) {
  absl::StatusOr<ConnectionConfig> cfg = ResolveConfig(WithFlags(
      {{"uri", "clickhouse://me:pw@h1:9001,[::1]:9002,h3/db?cluster=c"}, {"port", "9000"}}));
  ASSERT_THAT(cfg.status(), ::chstate::testing::IsOk());
  ASSERT_EQ(cfg->hosts.size(), 3u);
  EXPECT_EQ(cfg->hosts[0], (Endpoint{"h1", 9001}));
  EXPECT_EQ(cfg->hosts[1], (Endpoint{"::1", 9002}));
  // A host without a port takes the port setting.
  EXPECT_EQ(cfg->hosts[2], (Endpoint{"h3", 9000}));
  EXPECT_EQ(cfg->host, "h1");
  EXPECT_EQ(cfg->port, 9001);
  EXPECT_THAT(cfg->RedactedUri(), ::testing::HasSubstr("@h1:9001,[::1]:9002,h3:9000/db"));
  EXPECT_THAT(cfg->RedactedUri(), ::testing::Not(::testing::HasSubstr("pw")));
}

TEST(HostListTest, HostSettingListAndOneHostStaysOne) {
  absl::StatusOr<ConnectionConfig> cfg =
      ResolveConfig(WithFlags({{"host", "a:1,b"}, {"user", "u"}, {"database", "d"}, {"cluster", "c"}}));
  ASSERT_THAT(cfg.status(), ::chstate::testing::IsOk());
  EXPECT_EQ(cfg->hosts, (std::vector<Endpoint>{{"a", 1}, {"b", 8123}}));
  absl::StatusOr<ConnectionConfig> one = ResolveConfig(WithFlags({{"host", "a"}, {"user", "u"}, {"database", "d"}}));
  ASSERT_THAT(one.status(), ::chstate::testing::IsOk());
  EXPECT_EQ(one->hosts, (std::vector<Endpoint>{{"a", 8123}}));
}

TEST(RedactedUriTest, ShowsANonDefaultQuorum) {
  ASSERT_OK_AND_ASSIGN(ConnectionConfig three,
                       ResolveConfig(WithFlags({{"uri", "clickhouse://u:pw@h/d?cluster=c&quorum=3"}})));
  EXPECT_THAT(three.RedactedUri(), ::testing::EndsWith("&cluster=c&quorum=3"));
  ASSERT_OK_AND_ASSIGN(ConnectionConfig two, ResolveConfig(WithFlags({{"uri", "clickhouse://u:pw@h/d?cluster=c"}})));
  EXPECT_THAT(two.RedactedUri(), ::testing::Not(::testing::HasSubstr("quorum")));
}

TEST(HostListTest, SeveralHostsNeedClusterMode) {
  EXPECT_THAT(ResolveConfig(WithFlags({{"uri", "clickhouse://u@h1,h2/db"}})).status(),
              ::chstate::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                           ::testing::HasSubstr("needs cluster mode")));
}

TEST(HostListTest, BadEntriesAreNamed) {
  EXPECT_THAT(ResolveConfig(WithFlags({{"uri", "clickhouse://u:pw@h1,,h2/db?cluster=c"}})).status(),
              ::chstate::testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("empty entry")));
  // A port with no host (found by the config fuzzer: it used to read an
  // empty host).
  EXPECT_THAT(ResolveConfig(WithFlags({{"uri", "clickhouse://u:pw@h1,:8639/db?cluster=c"}})).status(),
              ::chstate::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                           ::testing::HasSubstr("entry \":8639\" has no host")));
  EXPECT_THAT(ParseClickHouseUri("clickhouse://u@:1,h2/db").status(),
              ::chstate::testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("has no host")));
  absl::Status bad = ResolveConfig(WithFlags({{"host", "h1,h 2:x"}, {"user", "u"}, {"database", "d"},
                                              {"cluster", "c"}, {"password", "pw"}}))
                         .status();
  EXPECT_THAT(bad, ::chstate::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                                ::testing::HasSubstr("h1:8123,h2:8123,h3:8123")));
  EXPECT_THAT(std::string(bad.message()), ::testing::Not(::testing::HasSubstr("pw")));
}

}  // namespace
}  // namespace chstate
