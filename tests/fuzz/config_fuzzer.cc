// Fuzzes the connection configuration (core/config.h): clickhouse:// URI
// parsing and the precedence resolution over flags and environment.
//
// Properties: nothing crashes; errors are kInvalidArgument with a printable
// message; a password never appears in an error message or in RedactedUri,
// whichever layer (flag, URI flag, Meltano URI variable, CLICKHOUSE_PASSWORD)
// it came from; a resolved config has a port in 1..65535, a non-empty user
// and database, and valid schema/table identifiers.
#include <cstddef>
#include <cstdint>
#include <string>

#include <fuzzer/FuzzedDataProvider.h>

#include "core/config.h"
#include "core/quoting.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// Recognisable secrets, one per layer. Alphanumeric so that no escaping can
// disguise them in a message.
constexpr const char* kFlagSecret = "FlagPw7Qx9Zk";
constexpr const char* kUriSecret = "UriPw3Jw8Lm";
constexpr const char* kEnvUriSecret = "EnvUriPw5Tv2";
constexpr const char* kEnvSecret = "EnvPw4Rn6Hb";

bool Contains(const std::string& hay, const char* needle) { return hay.find(needle) != std::string::npos; }

bool Hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// A marker in output text, not counting one whose first letter is the last
// digit of an escape: the fuzzer may type "^nvPw4Rn6Hb" as a user, which the
// URI shows as "%5EnvPw4Rn6Hb" (an error as "\x5e..."). No marker's second
// letter is a hex digit, so an escape can supply only a marker's first one.
bool Leaks(const std::string& text, const char* marker) {
  for (size_t p = text.find(marker); p != std::string::npos; p = text.find(marker, p + 1)) {
    const bool percent = p >= 2 && text[p - 2] == '%' && Hex(text[p - 1]);
    const bool hex = p >= 3 && text[p - 3] == '\\' && text[p - 2] == 'x' && Hex(text[p - 1]);
    if (!percent && !hex) return true;
  }
  return false;
}

std::string Pick(FuzzedDataProvider& in, std::initializer_list<const char*> options) {
  return *(options.begin() + in.ConsumeIntegralInRange<size_t>(0, options.size() - 1));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);

  // 1. A raw URI: any bytes.
  const std::string raw = in.ConsumeRandomLengthString(512);
  absl::StatusOr<chstate::UriParts> parts = chstate::ParseClickHouseUri(raw);
  if (!parts.ok()) {
    FUZZ_CHECK(parts.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(chstate_fuzz::PrintableAscii(std::string(parts.status().message())),
               std::string(parts.status().message()));
  } else if (parts->port) {
    FUZZ_CHECK(*parts->port >= 1 && *parts->port <= 65535);
  }

  // 2. Sources whose passwords are known markers, the rest fuzzed.
  chstate::ConfigSources src;
  const std::string scheme = Pick(in, {"clickhouse://", "clickhouses://", "http://", "https://", "", "ftp://"});
  const std::string tail = in.ConsumeRandomLengthString(256);
  const std::string user = in.ConsumeRandomLengthString(16);
  // Every fuzzed text that ends up in the sources, to tell a leak from a
  // marker the fuzzer typed into a host or database name itself.
  std::string fuzz_text = tail + user;
  if (in.ConsumeBool()) src.flags["uri"] = scheme + user + ":" + kUriSecret + "@" + tail;
  if (in.ConsumeBool()) src.flags["password"] = kFlagSecret;
  if (in.ConsumeBool()) {
    const std::string env_tail = in.ConsumeRandomLengthString(64);
    fuzz_text += env_tail;
    src.env["MELTANO_STATE_BACKEND_URI"] = scheme + "u:" + kEnvUriSecret + "@" + env_tail;
  }
  if (in.ConsumeBool()) src.env["CLICKHOUSE_PASSWORD"] = kEnvSecret;
  for (int i = 0; i < 6 && in.remaining_bytes() > 0; ++i) {
    const std::string key = Pick(in, {"host", "port", "database", "user", "secure", "schema", "table", "ca_file", "cluster", "quorum"});
    const std::string value = in.ConsumeRandomLengthString(32);
    fuzz_text += value;
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
      case 0: src.flags[key] = value; break;
      case 1: {
        std::string upper;
        for (char c : key) upper.push_back(static_cast<char>(c == '_' ? '_' : c - 'a' + 'A'));
        src.env["MELTANO_STATE_BACKEND_CLICKHOUSE_" + upper] = value;
        break;
      }
      default: {
        std::string upper;
        for (char c : key) upper.push_back(static_cast<char>(c == '_' ? '_' : c - 'a' + 'A'));
        src.env["CLICKHOUSE_" + upper] = value;
      }
    }
  }
  for (const char* m : {kFlagSecret, kUriSecret, kEnvUriSecret, kEnvSecret}) {
    if (Contains(fuzz_text, m)) return 0;
  }

  absl::StatusOr<chstate::ConnectionConfig> cfg = chstate::ResolveConfig(src);
  if (!cfg.ok()) {
    const std::string msg(cfg.status().message());
    FUZZ_CHECK(cfg.status().code() == absl::StatusCode::kInvalidArgument, msg);
    FUZZ_CHECK(chstate_fuzz::PrintableAscii(msg), msg);
    for (const char* m : {kFlagSecret, kUriSecret, kEnvUriSecret, kEnvSecret}) {
      FUZZ_CHECK(!Leaks(msg, m), "a password leaked into an error: " + msg);
    }
    return 0;
  }
  FUZZ_CHECK(cfg->port >= 1 && cfg->port <= 65535);
  FUZZ_CHECK(!cfg->user.empty() && !cfg->database.empty());
  FUZZ_CHECK(chstate::ValidateIdentifier(cfg->schema, "schema").ok(), cfg->schema);
  FUZZ_CHECK(chstate::ValidateIdentifier(cfg->table, "table").ok(), cfg->table);
  const std::string redacted = cfg->RedactedUri();
  for (const char* m : {kFlagSecret, kUriSecret, kEnvUriSecret, kEnvSecret}) {
    FUZZ_CHECK(!Leaks(redacted, m), "RedactedUri shows a password: " + redacted);
  }
  return 0;
}
