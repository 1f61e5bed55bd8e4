// Every setting a user gives chstate, in one table, and the one function that
// turns a host's raw inputs (flags, URI, environment, Meltano's settings, a
// Lua table, a JS object) into the store's options, each with where it came
// from. No host parses a duration, maps a setting to a store option or holds
// a default: the same inputs give the same options in every runtime.
//
//   chstate::SettingsSources src;
//   src.from = chstate::SettingsFrom::kApi;          // how values are named in messages
//   src.values = {{"uri", "clickhouse://me@db:8123/default"}, {"lock_timeout_seconds", "30"}};
//   src.env = {{"MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD", "..."}};
//   absl::StatusOr<chstate::Settings> s = chstate::ResolveSettings(src);
//   // s->store.lock.stale_ms == 30000, s->store.lock.timeout_ms == 61000 (2 x 30 s + 1 s),
//   // s->origin["lock_timeout_seconds"] == "the lock_timeout_seconds setting"
//
// Precedence, per setting, first match wins: the host's own value (a flag, a
// Meltano setting, an API key); for connection settings the component of the
// `uri` value; the setting's environment variable (MELTANO_STATE_BACKEND_...);
// for connection settings the component of MELTANO_STATE_BACKEND_URI, then the
// generic CLICKHOUSE_<KEY> (core/config.h); the default. Values arrive as
// text (an API's numbers and booleans as their JSON text).
#ifndef CHSTATE_CORE_SETTINGS_H_
#define CHSTATE_CORE_SETTINGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/config.h"
#include "core/diagnostics.h"
#include "core/store.h"

namespace chstate {

// How a setting's text is read.
enum class SettingType {
  kText,     // as given
  kSecret,   // as given; never shown
  kBool,     // true/false, 1/0, yes/no, on/off
  kPort,     // 1..65535
  kCount,    // a whole number, 0..1,000,000 (0 where the row says it means "none")
  kSeconds,  // a number of seconds, fractions allowed (0.5), at most a year
};

enum class SettingGroup { kConnection, kCluster, kLock, kTimeouts, kHistory };

// A default given as a number: milliseconds for kSeconds, the count for
// kCount; kNoNumber for the others and for defaults computed from other
// settings (default_text says how).
inline constexpr int64_t kNoNumber = INT64_MIN;

struct SettingSpec {
  const char* key;        // the name everywhere: API keys, Meltano's state_backend.<ns>.<key>
  SettingType type;
  SettingGroup group;
  int64_t default_number;   // see kNoNumber
  const char* default_text; // when default_number is kNoNumber: the default as users read it ("" = none)
  bool meltano_core;      // Meltano's own setting (state_backend.<key>), not the backend's
  const char* env;        // its environment variable (Meltano's name for it)
  const char* cli_flag;   // chstate's flag, without "--", where it is not the key ("" = the key with dashes)
  double min;             // for numbers: the smallest value accepted (seconds or count)
  const char* meaning;    // one line, for --help, Meltano's settings and the docs
};

// chstate's flag for the setting, without "--": "stale-lock", "history-days".
std::string CliFlag(const SettingSpec& spec);

// The default as users read it: "10" (seconds), "8123 (8443 with secure)", "".
std::string DefaultText(const SettingSpec& spec);

// The table. Connection settings (group kConnection, kCluster) are resolved
// with core/config.h's precedence (they also come from URIs and CLICKHOUSE_*).
extern const SettingSpec kSettings[];
extern const size_t kSettingsCount;

// The row of `key`, or nullptr.
const SettingSpec* FindSetting(absl::string_view key);

// Old names that now mean something else or are spelled otherwise: using one
// is an error that names the new one.
struct RenamedSetting {
  const char* old_key;
  const char* new_key;
};
extern const RenamedSetting kRenamedSettings[];
extern const size_t kRenamedSettingsCount;

// What the host can do, which decides lock policy (not the user): a host
// that calls back at the core's timeout while idle (a thread, an event loop)
// and releases what it holds when its process ends may keep a released lock
// lingering for the next acquisition (docs/lock.md "The lock off the hot path").
struct HostCapabilities {
  bool timers = false;        // calls back at next_timeout_ms even while its user code runs
  bool exit_release = false;  // closes stores (releasing locks) when the process ends
  // What the host routes to its users (core/diagnostics.h): nothing unless
  // it asks; statements (debug) show states redacted unless show_states.
  DiagnosticLevel diagnostics = DiagnosticLevel::kNone;
  bool show_states = false;
};

struct SettingsSources {
  SettingsFrom from = SettingsFrom::kApi;
  // The host's own values by setting key ("uri" included). Empty text = not given.
  std::map<std::string, std::string> values;
  // Environment variables by name (the host's process environment, or none).
  std::map<std::string, std::string> env;
  HostCapabilities host;
};

struct Settings {
  // Where to connect and as whom: what a host's transport needs.
  ConnectionConfig connection;
  int64_t connect_timeout_ms = 0;
  // chdb:// (an embedded chDB in the host's process): its directory; the
  // connection then holds only schema and table.
  std::string chdb_path;
  // Everything the store needs.
  StoreOptions store;
  // Where each setting came from ("default", "MELTANO_STATE_BACKEND_...",
  // "--stale-lock flag", ...), for every key of kSettings.
  std::map<std::string, std::string> origin;
};

// A resolved setting's value as text, in the setting's own unit ("10" for a
// 10 s lock_timeout_seconds; "***" for a password that is set): what
// `chstate settings` and every binding's settings view show.
std::string ValueText(const Settings& settings, const SettingSpec& spec);

// Every password the inputs hold, wherever given (the password value or
// variable, CLICKHOUSE_PASSWORD, a URI's user info), resolved or not: a host
// scrubs them from every message, including one about inputs that do not
// resolve.
std::vector<std::string> SecretsGiven(const SettingsSources& sources);

// Resolves every setting. Errors (kInvalidArgument), each naming where the
// bad value came from and what to write instead: an unknown or renamed key;
// a value of the wrong type or out of range; everything ResolveConfig
// refuses; settings that contradict each other (several hosts without a
// cluster, python_locks with a validity the Python backend cannot follow).
// The password appears in no message.
absl::StatusOr<Settings> ResolveSettings(const SettingsSources& sources);

}  // namespace chstate

#endif  // CHSTATE_CORE_SETTINGS_H_
