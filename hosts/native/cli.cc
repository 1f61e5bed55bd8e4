// The `chstate` command line: the core's verbs as commands, the core's
// settings as flags. Arguments are parsed from two tables (the settings'
// flags come from core/settings.h, the rest are below); the settings are
// resolved by the core (flags, environment, defaults), each command runs its
// verb (core/verbs.h) through the native executor, and the outcome is
// printed as text or --json with a documented exit code.
#include "hosts/native/cli.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/config.h"
#include "core/defaults.h"
#include "core/diagnostics.h"
#include "core/dialect.h"
#include "core/quoting.h"
#include "core/settings.h"
#include "core/state.h"
#include "core/store.h"
#include "core/verbs.h"
#include "hosts/common/protocol.h"
#include "hosts/native/executor.h"
#include "hosts/native/lock_command.h"
#include <nlohmann/json.hpp>

namespace chstate::cli {
namespace {

using json = nlohmann::json;
using Env = std::map<std::string, std::string>;

constexpr char kVersion[] = "0.1.0";

// ---------------------------------------------------------------------------
// Tables: every option and command, with the text `--help` prints.

struct OptionSpec {
  std::string name;     // long name, without "--"
  char short_name;      // '\0': none
  const char* metavar;  // nullptr: a switch (which also takes --name=true|false)
  const char* group;    // heading in `chstate --help`; nullptr: a command option
  std::string help;
  // The setting of core/settings.h this flag gives (nullptr: a command's own option).
  const SettingSpec* setting = nullptr;
};

constexpr char kConnection[] = "Connection";
constexpr char kCluster[] = "Cluster mode";
constexpr char kLocking[] = "Locking and timeout";
constexpr char kHistory[] = "History";
constexpr char kOutput[] = "Output";

// The options of the commands themselves (settings are the core's table).
const OptionSpec kCommandOptions[] = {
    {"json", 0, nullptr, kOutput, "print results, and errors, as one JSON object on stdout"},
    {"verbose", 'v', nullptr, kOutput,
     "tell on stderr why a run waits or changes course: a lock held by another process (whose, how long it stays "
     "valid, the next try), a request sent again and why, a host marked down and the next one, a lease lost. "
     "-vv (or --verbose twice) also tells each statement with its time and outcome, states' contents shown as "
     "<state: N bytes> (docs/diagnostics.md)"},
    {"log-format", 0, "FORMAT", kOutput,
     "how -v and -vv write to stderr: text (default; one line each) or json (one JSON object per line: kind, level, "
     "at_ms, state_id, message, line, numbers, texts)"},
    {"show-states", 0, nullptr, kOutput,
     "with -vv, show the states' contents in the statements instead of <state: N bytes> (they may hold what your "
     "sources' bookmarks hold)"},
    {"help", 'h', nullptr, kOutput, "show help; `chstate COMMAND --help` for one command"},
    {"version", 0, nullptr, kOutput, "print the version"},
    {"pattern", 0, "GLOB", nullptr, "only ids matching GLOB: * matches any run, ? one character"},
    {"null", 0, nullptr, nullptr, "end each id with a NUL byte instead of a newline (for ids with newlines)"},
    {"input-file", 0, "FILE", nullptr, "read the state JSON from FILE (- for stdin)"},
    {"force", 0, nullptr, nullptr,
     "set, merge: accept a state without a top-level \"singer_state\" key; unlock: remove the lock whoever holds it"},
    {"from-state-id", 0, "SRC", nullptr, "merge the state of SRC (its merged view) into ID"},
    {"all", 0, nullptr, nullptr, "remove every state id"},
    {"limit", 0, "N", nullptr, "list at most N versions (default 20)"},
    {"output", 'o', "FILE", nullptr, "write to FILE (replaced only once the whole export is read) instead of stdout"},
};

const char* GroupOf(const SettingSpec& s) {
  switch (s.group) {
    case SettingGroup::kConnection: return kConnection;
    case SettingGroup::kCluster: return kCluster;
    case SettingGroup::kLock:
    case SettingGroup::kTimeouts: return kLocking;
    case SettingGroup::kHistory: return kHistory;
  }
  return kConnection;
}

const char* MetavarOf(const SettingSpec& s) {
  switch (s.type) {
    case SettingType::kBool: return nullptr;
    case SettingType::kSeconds: return "SECONDS";
    case SettingType::kCount: return "N";
    case SettingType::kPort: return "PORT";
    case SettingType::kSecret: return "SECRET";
    case SettingType::kText: break;
  }
  const std::string key = s.key;
  if (key == "uri") return "URI";
  if (key == "host") return "HOST";
  if (key == "ca_file") return "FILE";
  if (key == "zookeeper_path") return "PATH";
  return "NAME";
}

// Every option: one per setting the CLI can use, then the commands' own.
const std::vector<OptionSpec>& Options() {
  static const std::vector<OptionSpec>* const kAll = [] {
    auto* all = new std::vector<OptionSpec>();
    for (size_t i = 0; i < kSettingsCount; ++i) {
      const SettingSpec& st = kSettings[i];
      // The command line never keeps a lock lingering (it does not run on between commands).
      if (std::string(st.key) == "linger_locks") continue;
      std::string help = st.meaning;
      const std::string dflt = DefaultText(st);
      if (!dflt.empty()) absl::StrAppend(&help, " (default ", dflt, ")");
      if (st.env[0] != '\0') absl::StrAppend(&help, "; ", st.env);
      all->push_back(OptionSpec{CliFlag(st), 0, MetavarOf(st), GroupOf(st), std::move(help), &st});
    }
    for (const OptionSpec& o : kCommandOptions) all->push_back(o);
    return all;
  }();
  return *kAll;
}

struct Session;
using Handler = absl::Status (*)(Session&);

constexpr size_t kUnlimited = static_cast<size_t>(-1);

struct CommandSpec {
  const char* name;
  const char* synopsis;  // what follows the name in a usage line
  const char* summary;   // one line for `chstate --help`
  const char* details;   // paragraph for `chstate COMMAND --help`
  std::vector<const char*> options;
  size_t min_args;
  size_t max_args;
  Handler run;
};

const std::vector<CommandSpec>& Commands();

const OptionSpec* FindOption(absl::string_view name) {
  for (const OptionSpec& o : Options()) {
    if (name == o.name) return &o;
  }
  return nullptr;
}

const OptionSpec* FindShortOption(char c) {
  for (const OptionSpec& o : Options()) {
    if (o.short_name != 0 && o.short_name == c) return &o;
  }
  return nullptr;
}

const CommandSpec* FindCommand(absl::string_view name) {
  for (const CommandSpec& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

bool CommandAllows(const CommandSpec& command, absl::string_view option) {
  return std::any_of(command.options.begin(), command.options.end(),
                     [option](const char* o) { return option == o; });
}

// User-supplied text (ids, file names, unknown commands) for a one-line
// message: quoted, bytes outside printable ASCII as \xHH, and cut short, so a
// 100 KB id with newlines cannot flood or break the line.
std::string Quoted(absl::string_view text) {
  constexpr size_t kMax = 200;
  constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (size_t i = 0; i < text.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c > 0x7E) {
      out.append("\\x");
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xF]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (text.size() > kMax) out.append("...");
  out.push_back('"');
  return out;
}

// ---------------------------------------------------------------------------
// Parsing

struct Invocation {
  const CommandSpec* command = nullptr;
  bool command_given = false;  // a command word was seen (it may be unknown)
  std::vector<std::string> args;
  std::map<std::string, std::string> values;  // options with a value; the last one wins
  std::map<std::string, bool> switches;       // switches given, on or off
  int verbose = 0;                            // -v: 1, -vv (or -v -v): 2; --verbose=false: 0
  // The first parse error. Parsing goes on after it so that `--help` and
  // `--json` are honoured wherever they appear.
  absl::Status error;

  bool On(const std::string& name) const {
    auto it = switches.find(name);
    return it != switches.end() && it->second;
  }
  const std::string* Value(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? nullptr : &it->second;
  }
};

// Options may come before or after the command; the first word that is not
// an option is the command and the rest are its arguments. `--` ends the
// options (for state ids that begin with '-'); a lone `-` is an argument.
Invocation Parse(const std::vector<std::string>& argv) {
  Invocation inv;
  auto fail = [&inv](std::string message) {
    if (inv.error.ok()) inv.error = absl::InvalidArgumentError(std::move(message));
  };
  bool options_done = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (!options_done && arg == "--") {
      options_done = true;
      continue;
    }
    if (options_done || arg.size() < 2 || arg[0] != '-') {
      if (inv.command_given) {
        inv.args.push_back(arg);
      } else {
        inv.command_given = true;
        inv.command = FindCommand(arg);
        if (inv.command == nullptr) fail(absl::StrCat("unknown command ", Quoted(arg), "; see `chstate --help`"));
      }
      continue;
    }

    const OptionSpec* spec = nullptr;
    std::optional<std::string> inline_value;
    std::string shown;  // how the option is named in messages: never its value, which may be a secret
    if (arg[1] == '-') {
      absl::string_view body = absl::string_view(arg).substr(2);
      const size_t eq = body.find('=');
      if (eq != absl::string_view::npos) {
        inline_value = std::string(body.substr(eq + 1));
        body = body.substr(0, eq);
      }
      spec = FindOption(body);
      shown = absl::StrCat("--", body);
    } else {
      if (arg.size() == 2) spec = FindShortOption(arg[1]);
      // -vv, -vvv: --verbose as many times as there are v's.
      if (arg.size() > 2 && arg.find_first_not_of('v', 1) == std::string::npos) {
        spec = FindShortOption('v');
        inv.verbose += static_cast<int>(arg.size()) - 2;
      }
      shown = arg.substr(0, arg.find('='));
    }
    if (spec == nullptr) {
      fail(absl::StrCat("unknown option ", Quoted(shown), "; see `chstate --help` (put state ids that begin with "
                        "'-' after `--`)"));
      continue;
    }
    if (spec->metavar != nullptr) {
      std::optional<std::string> value;
      if (inline_value) {
        value = *std::move(inline_value);
      } else if (i + 1 < argv.size()) {
        value = argv[++i];
      }
      if (value) {
        // --host given several times lists several hosts (docs/cluster.md).
        auto it = inv.values.find(spec->name);
        if (spec->name == "host" && it != inv.values.end()) {
          absl::StrAppend(&it->second, ",", *value);
        } else {
          inv.values[spec->name] = *std::move(value);
        }
      } else {
        fail(absl::StrCat("--", spec->name, " needs a value: --", spec->name, " ", spec->metavar));
      }
    } else {
      std::optional<bool> on = inline_value ? ParseBool(*inline_value) : std::optional<bool>(true);
      if (!on) {
        fail(absl::StrCat("--", spec->name, " takes no value, or true/false"));
        continue;
      }
      inv.switches[spec->name] = *on;
      if (spec->name == "verbose") inv.verbose = *on ? inv.verbose + 1 : 0;
    }
  }
  return inv;
}

std::string UsageLine(const CommandSpec& c) {
  return absl::StrCat("chstate ", c.name, c.synopsis[0] ? " " : "", c.synopsis);
}

// What Parse could not check alone: a known command, options that belong to
// it, and the number of arguments.
absl::Status Validate(const Invocation& inv) {
  if (!inv.error.ok()) return inv.error;
  if (inv.command == nullptr) return absl::InvalidArgumentError("no command given; see `chstate --help`");
  const CommandSpec& c = *inv.command;
  auto check = [&c](const std::string& name) -> absl::Status {
    const OptionSpec* spec = FindOption(name);
    if (spec->group == nullptr && !CommandAllows(c, name)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " is not an option of `chstate ", c.name,
                                                     "`; see `chstate ", c.name, " --help`"));
    }
    return absl::OkStatus();
  };
  for (const auto& [name, value] : inv.values) {
    if (absl::Status s = check(name); !s.ok()) return s;
  }
  for (const auto& [name, on] : inv.switches) {
    if (absl::Status s = check(name); !s.ok()) return s;
  }
  if (const std::string* format = inv.Value("log-format"); format != nullptr && *format != "text" && *format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-format must be text or json, not ", Quoted(*format), " (it says how -v writes to stderr)"));
  }
  if (inv.args.size() < c.min_args || inv.args.size() > c.max_args) {
    return absl::InvalidArgumentError(absl::StrCat(inv.args.size() < c.min_args ? "too few" : "too many",
                                                   " arguments; usage: ", UsageLine(c),
                                                   " (see `chstate ", c.name, " --help`)"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Output

// Prints results and errors, in text or JSON, and keeps secrets out of every
// message.
class Reporter {
 public:
  Reporter(std::ostream& out, std::ostream& err, bool json_mode) : out_(out), err_(err), json_(json_mode) {}

  bool json_mode() const { return json_; }
  std::ostream& out() { return out_; }

  void AddSecret(const std::string& secret) {
    if (secret.empty()) return;
    secrets_.push_back(secret);
    // Longest first, so a secret that contains another is hidden whole.
    std::sort(secrets_.begin(), secrets_.end(),
              [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  }

  // Messages are built so that they never hold the password; this is the
  // second line of defence, for text that came from elsewhere (a server
  // error echoing a query, a value typed into the wrong flag).
  std::string Redact(std::string text) const {
    for (const std::string& s : secrets_) text = absl::StrReplaceAll(text, {{s, "***"}});
    return text;
  }

  // One JSON document per line. DumpJson never throws (invalid UTF-8 in ids
  // becomes U+FFFD).
  void Emit(const json& j) { out_ << DumpJson(j) << '\n'; }

  std::ostream& err() { return err_; }

  // One diagnostic (core/diagnostics.h) on stderr, as the core told it:
  // "chstate: info: LINE", or with --log-format json one object per line
  // (the protocol's event, the state id printable). Flushed at once: a
  // waiting run says so while it waits.
  void Diagnose(const Diagnostic& d, bool json_lines) {
    if (json_lines) {
      json e = protocol::DiagnosticJson(d);
      e.erase("state_id_hex");
      if (!d.state_id.empty()) e["state_id"] = PrintableId(d.state_id);
      err_ << Redact(DumpJson(e)) << '\n';
    } else {
      std::string line = Redact(DiagnosticLine(d));
      std::replace_if(line.begin(), line.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
      err_ << "chstate: " << DiagnosticLevelName(d.level) << ": " << line << '\n';
    }
    err_.flush();
  }

  int Fail(const absl::Status& status) {
    const ExitCode code = ExitCodeFor(status.code());
    std::string message = Redact(std::string(status.message()));
    std::replace_if(message.begin(), message.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
    if (json_) {
      Emit({{"error",
             {{"code", absl::StatusCodeToString(status.code())},
              {"message", message},
              {"exit_code", static_cast<int>(code)}}}});
    } else {
      err_ << "chstate: " << message << '\n';
    }
    return code;
  }

 private:
  std::ostream& out_;
  std::ostream& err_;
  bool json_;
  std::vector<std::string> secrets_;
};

// The user's inputs as the core's settings sources: each flag under its
// setting's key (the CLI's binding of the settings table), and the
// environment. What they mean is the core's (ResolveSettings).
SettingsSources SourcesOf(const Invocation& inv, const Env& env) {
  SettingsSources sources;
  sources.from = SettingsFrom::kCli;
  sources.env = env;
  // What the store tells on stderr (Diagnose): -v the info level (why a run
  // waits or changes course, and warnings), -vv also the statements.
  sources.host.diagnostics = inv.verbose >= 2   ? DiagnosticLevel::kDebug
                             : inv.verbose == 1 ? DiagnosticLevel::kInfo
                                                : DiagnosticLevel::kNone;
  sources.host.show_states = inv.On("show-states");
  // For `lock`, --timeout is how long to wait for the lock (flock -w), and
  // only that: its requests keep their own timeout.
  const bool lock = inv.command != nullptr && std::string(inv.command->name) == "lock";
  for (const OptionSpec& o : Options()) {
    if (o.setting == nullptr) continue;
    if (lock && std::string(o.name) == "timeout") continue;
    if (o.metavar != nullptr) {
      if (const std::string* v = inv.Value(o.name)) sources.values[o.setting->key] = *v;
    } else if (auto it = inv.switches.find(o.name); it != inv.switches.end()) {
      sources.values[o.setting->key] = it->second ? "true" : "false";
    }
  }
  if (lock && inv.Value("timeout") != nullptr && inv.Value("lock-timeout") == nullptr) {
    sources.values["lock_wait_seconds"] = *inv.Value("timeout");
  }
  return sources;
}

// Every password the user may have given, wherever it was given: messages
// can fail before (or because) the configuration resolves.
void CollectSecrets(const Invocation& inv, const Env& env, Reporter& report) {
  for (const std::string& secret : SecretsGiven(SourcesOf(inv, env))) report.AddSecret(secret);
}

json StateJson(const MeltanoState& state) {
  return {{"state_id", state.state_id},
          {"completed", state.completed},
          {"partial", state.partial},
          {"merged", state.Merged()}};
}

// ---------------------------------------------------------------------------
// Connection and execution

// Everything one command needs: its arguments, streams and, once Connect
// has run, the resolved settings, transport and store.
struct Session {
  const Invocation& inv;
  const Env& env;
  std::istream& in;
  Reporter& report;
  Settings settings{};
  std::unique_ptr<native::HttpExecutor> exec{};
  std::unique_ptr<Store> store{};
  std::unique_ptr<Connection> conn{};  // pumps `store`

  int exit_code = 0;  // set by commands whose exit code is not their status's (lock)

  // Runs a verb document (core/verbs.h): the core checks it and decides.
  absl::StatusOr<Result> Verb(json doc) {
    absl::StatusOr<std::unique_ptr<Task>> task = TaskForVerb(*store, doc);
    if (!task.ok()) return task.status();
    return native::RunOp(*conn, *std::move(task), *exec);
  }
  const std::string& arg(size_t i) const { return inv.args[i]; }
  const ConnectionConfig& config() const { return settings.connection; }
};

// Resolves the settings (the core's: flags, environment, defaults) and builds
// the transport and store; nothing is sent yet.
absl::Status Connect(Session& s) {
  absl::StatusOr<Settings> settings = ResolveSettings(SourcesOf(s.inv, s.env));
  if (!settings.ok()) return settings.status();
  s.settings = *std::move(settings);
  s.report.AddSecret(s.settings.connection.password);
  if (!s.settings.chdb_path.empty()) {
    return absl::InvalidArgumentError(
        "the URI is chdb://, the embedded engine the Meltano adapter runs in its own process; the chstate command "
        "talks to a ClickHouse server over HTTP: give a clickhouse:// URI");
  }
  native::ExecutorOptions exec_options;
  exec_options.connect_timeout_ms = s.settings.connect_timeout_ms;
  if (s.inv.verbose > 0) {
    const bool json_lines = s.inv.Value("log-format") != nullptr && *s.inv.Value("log-format") == "json";
    exec_options.on_diagnostic = [&report = s.report, json_lines](const Diagnostic& d) {
      report.Diagnose(d, json_lines);
    };
  }
  s.exec = std::make_unique<native::HttpExecutor>(s.settings.connection, exec_options);
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Create(s.settings.store);
  if (!store.ok()) return store.status();
  s.store = *std::move(store);
  s.conn = std::make_unique<Connection>(s.store.get());
  return absl::OkStatus();
}

std::string ReadAll(std::istream& in) {
  // In blocks: an import document is a hundred megabytes or more, which an
  // istreambuf_iterator copies a character at a time.
  std::string out;
  char block[1 << 16];
  while (in.read(block, sizeof block) || in.gcount() > 0) out.append(block, static_cast<size_t>(in.gcount()));
  return out;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read --input-file ", Quoted(path), ": ", std::strerror(errno)));
  }
  std::string text = ReadAll(f);
  if (f.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("error reading --input-file ", Quoted(path), ": ", std::strerror(errno)));
  }
  return text;
}

// The state text from the JSON argument, `-` (stdin) or --input-file;
// nullopt when none was given.
absl::StatusOr<std::optional<std::string>> StateInput(Session& s, size_t arg_index) {
  const std::string* inline_text = s.inv.args.size() > arg_index ? &s.arg(arg_index) : nullptr;
  const std::string* file = s.inv.Value("input-file");
  if (inline_text != nullptr && file != nullptr) {
    return absl::InvalidArgumentError("give the state either as an argument or with --input-file, not both");
  }
  if (file != nullptr) {
    if (*file == "-") return ReadAll(s.in);
    absl::StatusOr<std::string> text = ReadFile(*file);
    if (!text.ok()) return text.status();
    return *std::move(text);
  }
  if (inline_text != nullptr) return *inline_text == "-" ? ReadAll(s.in) : *inline_text;
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Commands

// A verb document for this command: {"op": VERB, ...}.
json Op(const char* verb) { return json{{"op", verb}}; }
json Op(const char* verb, const std::string& state_id) {
  return json{{"op", verb}, {"state_id_hex", HexEncode(state_id)}};
}
void AddPattern(const Session& s, json& doc) {
  if (const std::string* p = s.inv.Value("pattern")) doc["pattern_hex"] = HexEncode(*p);
}

// JSON input text as the verbs take it; the parse error names where it broke.
absl::StatusOr<json> InputJson(const std::string& text, const char* what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // The core's parser words the position; only its message is wanted.
    absl::StatusOr<MeltanoState> probe = CompleteStateFromInput("-", text, /*require_singer_state=*/false);
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", what, " is not valid JSON", probe.ok() ? std::string() : absl::StrCat(": ", probe.status().message())));
  }
  return j;
}

absl::Status List(Session& s) {
  json doc = Op("list");
  AddPattern(s, doc);
  absl::StatusOr<Result> r = s.Verb(doc);
  if (!r.ok()) return r.status();
  if (s.report.json_mode()) {
    s.report.Emit({{"state_ids", r->state_ids}});
    return absl::OkStatus();
  }
  // Ids are written as raw bytes: they may be any bytes, and scripts need
  // them exactly as stored.
  const char end = s.inv.On("null") ? '\0' : '\n';
  for (const std::string& id : r->state_ids) s.report.out() << id << end;
  return absl::OkStatus();
}

absl::Status Get(Session& s) {
  absl::StatusOr<Result> r = s.Verb(Op("get", s.arg(0)));
  if (!r.ok()) return r.status();
  if (!r->state) {
    return absl::NotFoundError(
        absl::StrCat("state id ", Quoted(s.arg(0)), " has no state; `chstate list` shows the ids that have one"));
  }
  if (s.report.json_mode()) {
    s.report.Emit(StateJson(*r->state));
  } else {
    s.report.out() << DumpJson(r->state->Merged()) << '\n';
  }
  return absl::OkStatus();
}

absl::Status Set(Session& s) {
  absl::StatusOr<std::optional<std::string>> text = StateInput(s, 1);
  if (!text.ok()) return text.status();
  if (!*text) {
    return absl::InvalidArgumentError(
        "set needs the state: chstate set ID JSON, chstate set ID --input-file FILE, or chstate set ID - (stdin)");
  }
  absl::StatusOr<json> state = InputJson(**text, "state");
  if (!state.ok()) return state.status();
  json doc = Op("set", s.arg(0));
  doc["state"] = *std::move(state);
  if (s.inv.On("force")) doc["force"] = true;
  absl::StatusOr<Result> r = s.Verb(std::move(doc));
  if (!r.ok()) return r.status();
  if (s.report.json_mode() && r->state) s.report.Emit(StateJson(*r->state));
  return absl::OkStatus();
}

absl::Status Merge(Session& s) {
  absl::StatusOr<std::optional<std::string>> text = StateInput(s, 1);
  if (!text.ok()) return text.status();
  const std::string* source = s.inv.Value("from-state-id");
  if (source != nullptr && *text) {
    return absl::InvalidArgumentError("give one of a JSON argument, --input-file or --from-state-id, not several");
  }
  json doc = Op("merge", s.arg(0));
  if (source != nullptr) {
    doc["from_hex"] = HexEncode(*source);  // `meltano state merge --from-state-id`
  } else if (*text) {
    absl::StatusOr<json> partial = InputJson(**text, "state");
    if (!partial.ok()) return partial.status();
    doc["partial"] = *std::move(partial);
  } else {
    return absl::InvalidArgumentError(
        "merge needs the state: chstate merge ID JSON, --input-file FILE, - (stdin) or --from-state-id SRC");
  }
  if (s.inv.On("force")) doc["force"] = true;
  absl::StatusOr<Result> r = s.Verb(std::move(doc));
  if (!r.ok()) return r.status();
  if (s.report.json_mode() && r->state) s.report.Emit(StateJson(*r->state));
  return absl::OkStatus();
}

absl::Status CopyOrMove(Session& s, bool move) {
  absl::StatusOr<Result> r = s.Verb(
      {{"op", move ? "move" : "copy"}, {"src_hex", HexEncode(s.arg(0))}, {"dst_hex", HexEncode(s.arg(1))}});
  if (!r.ok()) return r.status();
  if (s.report.json_mode()) s.report.Emit({{"source", s.arg(0)}, {"destination", s.arg(1)}});
  return absl::OkStatus();
}

absl::Status Copy(Session& s) { return CopyOrMove(s, false); }
absl::Status Move(Session& s) { return CopyOrMove(s, true); }

absl::Status Clear(Session& s) {
  const bool all = s.inv.On("all");
  if (all == !s.inv.args.empty()) {
    return absl::InvalidArgumentError("clear takes either a state ID or --all; usage: chstate clear (ID | --all)");
  }
  if (all) {
    absl::StatusOr<Result> r = s.Verb(Op("clear_all"));
    if (!r.ok()) return r.status();
    if (s.report.json_mode()) {
      s.report.Emit({{"cleared", r->count}});
    } else {
      s.report.out() << r->count << '\n';
    }
    return absl::OkStatus();
  }
  absl::StatusOr<Result> r = s.Verb(Op("delete", s.arg(0)));
  if (!r.ok()) return r.status();
  if (s.report.json_mode()) s.report.Emit({{"state_id", s.arg(0)}});
  return absl::OkStatus();
}

// `chstate export`: Meltano's export document, read a page at a time and
// written as it comes, so memory stays flat in the number of states. With
// --output the file appears (renamed from FILE.chstate-partial) only once
// every page was read: a failed export never leaves a truncated document.
absl::Status Export(Session& s) {
  const std::string* output = s.inv.Value("output");
  if (output != nullptr && *output == "-") output = nullptr;
  std::ofstream file;
  std::string partial;
  if (output != nullptr) {
    partial = absl::StrCat(*output, ".chstate-partial");
    file.open(partial, std::ios::binary | std::ios::trunc);
    if (!file) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write --output ", Quoted(*output), ": ", std::strerror(errno)));
    }
  }
  std::ostream& out = output != nullptr ? static_cast<std::ostream&>(file) : s.report.out();
  auto abandon = [&](absl::Status st) {
    if (output != nullptr) {
      file.close();
      std::remove(partial.c_str());
    }
    return st;
  };
  int64_t count = 0;
  std::optional<std::string> after;
  out << "{";
  while (true) {
    json page = Op("export");
    AddPattern(s, page);
    if (after) page["after_hex"] = HexEncode(*after);
    page["document"] = true;  // the page as the document's entries, written by the core
    absl::StatusOr<Result> r = s.Verb(std::move(page));
    if (!r.ok()) return abandon(r.status());
    if (!r->state_ids.empty()) {
      out << (count == 0 ? "\n  " : ",\n  ") << *r->document;
      count += static_cast<int64_t>(r->state_ids.size());
    }
    if (!r->more || r->state_ids.empty()) break;
    after = r->state_ids.back();
  }
  out << (count == 0 ? "}\n" : "\n}\n");
  out.flush();
  if (output != nullptr) {
    file.close();
    if (!file || std::rename(partial.c_str(), output->c_str()) != 0) {
      return abandon(absl::InternalError(
          absl::StrCat("could not finish writing --output ", Quoted(*output), ": ", std::strerror(errno))));
    }
    if (s.report.json_mode()) {
      s.report.Emit({{"exported", count}, {"output", *output}});
    } else {
      s.report.err() << "chstate: exported " << count << " states to " << *output << '\n';
    }
  }
  return absl::OkStatus();
}

// `chstate import [FILE | -]`: every entry is checked before anything is
// written (the core's import_document), then written in a few multi-row
// INSERTs.
absl::Status Import(Session& s) {
  std::string text;
  if (s.inv.args.empty() || s.arg(0) == "-") {
    text = ReadAll(s.in);
  } else {
    absl::StatusOr<std::string> read = ReadFile(s.arg(0));
    if (!read.ok()) {
      return absl::InvalidArgumentError(absl::StrReplaceAll(read.status().message(), {{"--input-file ", ""}}));
    }
    text = *std::move(read);
  }
  json doc = json::object();
  doc["op"] = "import_document";
  doc["document"] = std::move(text);  // the core reads the document itself, in one pass
  absl::StatusOr<Result> r = s.Verb(std::move(doc));
  if (!r.ok()) return r.status();
  if (s.report.json_mode()) {
    s.report.Emit({{"imported", r->count}});
  } else {
    s.report.out() << r->count << '\n';
  }
  return absl::OkStatus();
}

// `chstate history ID`: the versions kept, newest first.
absl::Status History(Session& s) {
  json doc = Op("history", s.arg(0));
  if (const std::string* limit = s.inv.Value("limit")) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(*limit, &n)) {
      return absl::InvalidArgumentError(absl::StrCat("--limit is ", Quoted(*limit), ", which is not a whole number"));
    }
    doc["limit"] = n;  // the verb checks it
  }
  absl::StatusOr<Result> r = s.Verb(std::move(doc));
  if (!r.ok()) return r.status();
  if (s.report.json_mode()) {
    json versions = json::array();
    for (const StateVersion& v : *r->versions) {
      versions.push_back({{"version", v.version},
                          {"updated_at", v.updated_at},
                          {"current", v.current},
                          {"state", v.state.Merged()}});
    }
    s.report.Emit(versions);
    return absl::OkStatus();
  }
  if (r->versions->empty()) {
    s.report.err() << "chstate: state id " << Quoted(s.arg(0))
                   << " has no versions in its history (is history on? `chstate init` creates it)\n";
  }
  for (const StateVersion& v : *r->versions) {
    s.report.out() << v.version << '\t' << v.updated_at << '\t' << (v.current ? "current" : "-") << '\t'
                   << DumpJson(v.state.Merged()) << '\n';
  }
  return absl::OkStatus();
}

// `chstate rollback ID VERSION`: that version, restored under the lock.
absl::Status Rollback(Session& s) {
  json doc = Op("rollback", s.arg(0));
  doc["version"] = s.arg(1);
  absl::StatusOr<Result> r = s.Verb(std::move(doc));
  if (!r.ok()) return r.status();
  if (s.report.json_mode()) {
    s.report.Emit(StateJson(*r->state));
  } else {
    s.report.err() << "chstate: state id " << Quoted(s.arg(0)) << " is back at version " << s.arg(1) << '\n';
  }
  return absl::OkStatus();
}

json LockJson(const HeldLockInfo& l) {
  return {{"state_id", l.state_id ? json(*l.state_id) : json(nullptr)},
          {"table", l.table},
          {"holder", l.holder},
          {"held_s", l.held_s},
          {"renewed_s", l.renewed_s},
          {"validity_s", l.validity_s},
          {"stale", l.stale}};
}

// `chstate locks`: who holds which lock, by the server's clock.
absl::Status Locks(Session& s) {
  json doc = Op("locks");
  AddPattern(s, doc);
  absl::StatusOr<Result> r = s.Verb(std::move(doc));
  if (!r.ok()) return r.status();
  if (s.report.json_mode()) {
    json locks = json::array();
    for (const HeldLockInfo& l : *r->locks) locks.push_back(LockJson(l));
    s.report.Emit(locks);
    return absl::OkStatus();
  }
  for (const HeldLockInfo& l : *r->locks) {
    s.report.out() << (l.state_id ? *l.state_id : absl::StrCat("(no state yet; table ", l.table, ")")) << '\t'
                   << (l.holder.empty() ? "?" : l.holder) << "\theld " << l.held_s << " s\trenewed " << l.renewed_s
                   << " s ago\tvalid " << l.validity_s << " s\t" << (l.stale ? "stale" : "live") << '\n';
  }
  return absl::OkStatus();
}

// `chstate unlock ID --force`: removes a lock the operator knows is dead.
absl::Status Unlock(Session& s) {
  if (!s.inv.On("force")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unlock removes the lock on ", Quoted(s.arg(0)), " whoever holds it; if its holder is still running it "
        "loses the lock at its next renewal. Run `chstate locks` to see who holds it, then add --force"));
  }
  absl::StatusOr<Result> r = s.Verb(Op("unlock", s.arg(0)));
  if (!r.ok()) return r.status();
  const HeldLockInfo& l = r->locks->front();
  if (s.report.json_mode()) {
    s.report.Emit(LockJson(l));
  } else {
    s.report.err() << "chstate: removed the lock on state id " << Quoted(s.arg(0)) << ": holder "
                   << (l.holder.empty() ? "unknown" : l.holder) << ", taken " << l.held_s << " s ago, last renewed "
                   << l.renewed_s << " s ago, valid " << l.validity_s << " s (" << (l.stale ? "stale" : "live")
                   << ")\n";
  }
  return absl::OkStatus();
}

std::string DialectText(const Result& r) { return r.dialect ? DialectName(*r.dialect) : ""; }

absl::Status Init(Session& s) {
  absl::StatusOr<Result> r = s.Verb(Op(s.inv.command->name));  // init or compact
  if (!r.ok()) return r.status();
  const std::string version = s.report.Redact(r->server_version);
  if (s.report.json_mode()) {
    s.report.Emit({{"schema", s.config().schema},
                   {"table", s.config().table},
                   {"server_version", version},
                   {"dialect", DialectText(*r)}});
  } else {
    const bool compact = std::string(s.inv.command->name) == "compact";
    s.report.out() << (compact ? "compacted: " : "ready: ") << s.config().schema << "." << s.config().table
                   << " on ClickHouse " << version << '\n';
  }
  return absl::OkStatus();
}

absl::Status Ping(Session& s) {
  const int64_t start = native::MonotonicMs();
  absl::StatusOr<Result> r = s.Verb(Op("ping"));
  const int64_t round_trip_ms = native::MonotonicMs() - start;
  if (!r.ok()) return r.status();
  const std::string version = s.report.Redact(r->server_version);
  const std::string uri = s.report.Redact(s.config().RedactedUri());
  if (s.report.json_mode()) {
    s.report.Emit({{"server_version", version},
                   {"dialect", DialectText(*r)},
                   {"round_trip_ms", round_trip_ms},
                   {"uri", uri}});
  } else {
    s.report.out() << "server_version: " << version << "\ndialect: " << DialectText(*r)
                   << "\nround_trip_ms: " << round_trip_ms << "\nuri: " << uri << '\n';
  }
  return absl::OkStatus();
}

// `chstate settings`: every setting as the core resolved it and where it
// came from (flag, variable or default); never the password.
absl::Status SettingsCmd(Session& s) {
  json doc = protocol::SettingsJson(s.settings)["settings"];
  doc["connection"].erase("password");
  if (s.report.json_mode()) {
    s.report.Emit({{"settings", doc}});
    return absl::OkStatus();
  }
  for (size_t i = 0; i < kSettingsCount; ++i) {
    const std::string key = kSettings[i].key;
    auto origin = s.settings.origin.find(key);
    s.report.out() << key << '\t' << ValueText(s.settings, kSettings[i]) << '\t'
                   << (origin == s.settings.origin.end() ? "default" : origin->second) << '\n';
  }
  return absl::OkStatus();
}

absl::Status Lock(Session& s) {
  std::vector<std::string> command(s.inv.args.begin() + 1, s.inv.args.end());
  return native::RunLocked(*s.conn, *s.exec, s.arg(0), command, s.report.err(), &s.exit_code);
}

const std::vector<CommandSpec>& Commands() {
  static const std::vector<CommandSpec>* const kCommands = new std::vector<CommandSpec>{
      {"list", "[--pattern GLOB] [--null]", "list state ids, one per line",
       "Prints every state id (matching GLOB, if given), sorted, one per line as raw bytes.", {"pattern", "null"},
       0, 0, List},
      {"get", "ID", "print the state of ID as JSON",
       "Prints the merged view of ID's state (partial laid over completed), as `meltano state get` does. "
       "Exits 3 when ID has no state.",
       {}, 1, 1, Get},
      {"set", "ID (JSON | --input-file FILE | -) [--force]", "replace the state of ID",
       "Replaces ID's state under its lock: completed = the input, partial = {}. The input must be a JSON "
       "object with a top-level \"singer_state\" key unless --force is given. `-` reads it from stdin.",
       {"input-file", "force"}, 1, 2, Set},
      {"merge", "ID (JSON | --input-file FILE | - | --from-state-id SRC) [--force]", "merge a partial state into ID",
       "Merges the input into ID's partial state under its lock, as Meltano does for every STATE message: "
       "objects merge recursively, lists and scalars from the input replace. With --from-state-id, the merged "
       "view of SRC is the input. The input needs a top-level \"singer_state\" key unless --force is given.",
       {"input-file", "from-state-id", "force"}, 1, 2, Merge},
      {"copy", "SRC DST", "copy the state of SRC to DST",
       "Overwrites DST's state with SRC's, under DST's lock. Exits 3 when SRC has no state.", {}, 2, 2, Copy},
      {"move", "SRC DST", "move the state of SRC to DST",
       "Copies SRC's state to DST, then removes SRC (each under its lock). Exits 3 when SRC has no state.", {}, 2, 2,
       Move},
      {"clear", "(ID | --all)", "remove the state of ID, or of every id",
       "Removes ID's state under its lock, or with --all every state (without locks), printing how many were "
       "removed.",
       {"all"}, 0, 1, Clear},
      {"export", "[--pattern GLOB] [--output FILE]", "print every state in Meltano's export format",
       "Prints every state (matching GLOB, if given) as one JSON object {\"ID\": {\"completed\": {...}, "
       "\"partial\": {...}}, ...}, the format of `meltano state export`, read from ClickHouse a page of "
       "up to 10000 states at a time. With --output the file is written whole or not at all.",
       {"pattern", "output"}, 0, 0, Export},
      {"import", "[FILE | -]", "write every state of an export document",
       "Reads a document in the format of `meltano state export` (or `chstate export`) from FILE or stdin and "
       "overwrites the state of each id in it, in a few multi-row INSERTs, printing how many were written. Every "
       "entry is checked first: a document that is not JSON, has the wrong shape or a bad id is refused, naming "
       "the entry, and nothing is written. Takes no locks, as `meltano state import`.",
       {}, 0, 1, Import},
      {"history", "ID [--limit N]", "list the versions of ID's state, newest first",
       "Prints one line per version kept in the state history: VERSION, when it was written (UTC), `current` for "
       "the one the state table holds now, and the merged state. With --json, an array of {\"version\", "
       "\"updated_at\", \"current\", \"state\"}. On 18.x versions have whole seconds; several written in one "
       "second are listed in no particular order, the current one first.",
       {"limit"}, 1, 1, History},
      {"rollback", "ID VERSION", "restore a version of ID's state",
       "Writes VERSION (as `chstate history` names it) back as ID's state, under ID's lock; the restored state is "
       "itself a new version. Exits 3 when the history holds no such version.",
       {}, 2, 2, Rollback},
      {"compact", "", "apply retention: drop old history and old lock tombstones",
       "Removes state versions older than --history-days and beyond --history-versions per id (18.x has no TTL; "
       "modern servers also expire old ones on their own) and lock tombstones older than twice the lock validity. `chstate init` does the same after "
       "creating what is missing.",
       {}, 0, 0, Init},
      {"lock", "ID [--timeout SECONDS] -- COMMAND [ARGS...]", "run a command while holding ID's lock",
       "Takes ID's lock (waiting up to --timeout seconds, by default --lock-timeout: 2 x --stale-lock + --lock-retry), runs COMMAND, and releases the lock when "
       "COMMAND ends, like flock(1). COMMAND's exit code passes through (128+N if it died of signal N). "
       "SIGINT, SIGTERM and SIGHUP are passed to COMMAND and the lock is released after it ends. The lock is "
       "renewed while COMMAND runs; if it is lost anyway, COMMAND gets SIGTERM and chstate exits 7. Exits 4, "
       "without running COMMAND, when the lock is not free in time.",
       {}, 2, kUnlimited, Lock},
      {"locks", "[--pattern GLOB]", "list the locks held now, by whom and since when",
       "Prints one line per held lock: the state id, the holder's lock id, how long ago it was taken and last "
       "renewed and its validity (all by the server's clock), and `stale` once it is past its validity (the next "
       "process that wants it takes it over). A lock on an id that has no state yet is shown by its table "
       "(and only without --pattern). --json gives an array of objects.",
       {"pattern"}, 0, 0, Locks},
      {"unlock", "ID --force", "remove a lock whose holder is dead",
       "Removes ID's lock whoever holds it, as a takeover does, and says whose it was. A holder that is still "
       "running finds the lock lost at its next renewal and stops (`chstate lock` exits 7), so use it for a holder "
       "you know is dead when you cannot wait for its lock to go stale. Exits 3 when ID is not locked.",
       {"force"}, 1, 1, Unlock},
      {"init", "", "create the state database and tables",
       "Creates the schema, the state table and the lock table if they do not exist. Other commands create them "
       "on first write, so this is only needed to check grants up front.",
       {}, 0, 0, Init},
      {"settings", "", "print every setting as resolved, and where it came from",
       "Prints each setting with where its value came from (its flag, a variable, or the default), then the "
       "store's resolved options. --json gives {\"settings\": {\"connection\", \"store\", \"origin\"}}. "
       "Sends nothing; never prints the password.",
       {}, 0, 0, SettingsCmd},
      {"ping", "", "check the connection",
       "Asks the server for its version and prints it with the SQL dialect chosen, the round-trip time and the "
       "connection URI (without the password).",
       {}, 0, 0, Ping},
  };
  return *kCommands;
}

// ---------------------------------------------------------------------------
// Help

constexpr char kExitCodesHelp[] =
    "Exit codes:\n"
    "  0  success\n"
    "  1  unexpected or internal error\n"
    "  2  usage error or bad input (flags, JSON, configuration)\n"
    "  3  state id not found\n"
    "  4  lock not acquired in time (another process holds the state id)\n"
    "  5  ClickHouse unreachable, unavailable or timed out\n"
    "  6  ClickHouse refused the credentials or denied access\n"
    "  7  unsupported server version, or a failed precondition\n";

std::string OptionLabel(const OptionSpec& o) {
  std::string label = o.short_name ? absl::StrCat("-", std::string(1, o.short_name), ", ") : "    ";
  absl::StrAppend(&label, "--", o.name);
  if (o.metavar) absl::StrAppend(&label, " ", o.metavar);
  return label;
}

constexpr size_t kHelpWidth = 100;
constexpr size_t kHelpColumn = 30;

// Appends `text` word-wrapped to kHelpWidth, continuation lines indented by
// `indent`; the first line continues from `column`.
void AppendWrapped(std::string* out, absl::string_view text, size_t indent, size_t column) {
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (column > indent && column + 1 + word.size() > kHelpWidth) {
      absl::StrAppend(out, "\n", std::string(indent, ' '));
      column = indent;
    } else if (column > indent) {
      out->push_back(' ');
      ++column;
    }
    absl::StrAppend(out, word);
    column += word.size();
  }
  out->push_back('\n');
}

// "  LABEL   help", the help starting at kHelpColumn (on the next line when the
// label is too long).
void AppendRow(std::string* out, const std::string& label, absl::string_view help) {
  absl::StrAppend(out, "  ", label);
  if (label.size() + 3 <= kHelpColumn) {
    out->append(kHelpColumn - label.size() - 2, ' ');
  } else {
    absl::StrAppend(out, "\n", std::string(kHelpColumn, ' '));
  }
  AppendWrapped(out, help, kHelpColumn, kHelpColumn);
}

std::string GeneralHelp() {
  std::string out = absl::StrCat("chstate ", kVersion,
                                 ": Meltano state stored in ClickHouse\n\n"
                                 "Usage: chstate [OPTIONS] COMMAND [ARGS]\n\nCommands:\n");
  for (const CommandSpec& c : Commands()) {
    AppendRow(&out, absl::StrCat(c.name, c.synopsis[0] ? " " : "", c.synopsis), c.summary);
  }
  for (const char* group : {kConnection, kCluster, kLocking, kHistory, kOutput}) {
    absl::StrAppend(&out, "\n", group, " options (before or after the command):\n");
    for (const OptionSpec& o : Options()) {
      if (o.group == group) AppendRow(&out, OptionLabel(o), o.help);
    }
  }
  out.push_back('\n');
  AppendWrapped(&out,
                "Each setting comes from the first of: its flag; for connection settings the --uri flag; its "
                "variable (shown above); for connection settings MELTANO_STATE_BACKEND_URI, then CLICKHOUSE_<KEY> "
                "(HOST, PORT, USER, PASSWORD, DATABASE, SECURE, SCHEMA, TABLE); the default. User and database "
                "have no default.",
                0, 0);
  out.push_back('\n');
  AppendWrapped(&out, "State ids may hold any bytes. Put an id that begins with '-' after `--`: chstate get -- -id",
                0, 0);
  absl::StrAppend(&out, "\n", kExitCodesHelp, "\n`chstate COMMAND --help` describes one command.\n");
  return out;
}

std::string CommandHelp(const CommandSpec& c) {
  std::string out = absl::StrCat("Usage: ", UsageLine(c), " [OPTIONS]\n\n");
  AppendWrapped(&out, c.details, 0, 0);
  if (!c.options.empty()) {
    absl::StrAppend(&out, "\nOptions:\n");
    for (const char* name : c.options) {
      const OptionSpec* o = FindOption(name);
      AppendRow(&out, OptionLabel(*o), o->help);
    }
  }
  absl::StrAppend(&out,
                  "\nConnection, locking and output options (--uri, --json, ...): see `chstate --help`.\n\n",
                  kExitCodesHelp);
  return out;
}

}  // namespace

ExitCode ExitCodeFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return kExitUsage;
    case absl::StatusCode::kNotFound:
      return kExitNotFound;
    case absl::StatusCode::kAborted:
      return kExitLocked;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kExitUnavailable;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return kExitRefused;
    case absl::StatusCode::kFailedPrecondition:
      return kExitUnsupported;
    default:
      return kExitInternal;
  }
}

int Main(const std::vector<std::string>& args, const std::map<std::string, std::string>& env, std::istream& in,
         std::ostream& out, std::ostream& err) {
  const Invocation inv = Parse(args);
  Reporter report(out, err, inv.On("json"));
  CollectSecrets(inv, env, report);

  // Help and version win over everything else, so `chstate set --help`
  // works without the arguments `set` needs.
  if (inv.On("help")) {
    const std::string text = inv.command != nullptr ? CommandHelp(*inv.command) : GeneralHelp();
    if (report.json_mode()) {
      report.Emit({{"help", text}});
    } else {
      out << text;
    }
    return kExitOk;
  }
  if (inv.On("version")) {
    if (report.json_mode()) {
      report.Emit({{"version", kVersion}});
    } else {
      out << "chstate " << kVersion << '\n';
    }
    return kExitOk;
  }
  if (absl::Status s = Validate(inv); !s.ok()) return report.Fail(s);

  Session session{inv, env, in, report};
  if (absl::Status s = Connect(session); !s.ok()) return report.Fail(s);
  if (absl::Status s = inv.command->run(session); !s.ok()) return report.Fail(s);
  out.flush();
  if (session.exit_code != 0) return session.exit_code;
  if (!out) {
    // The operation itself succeeded; only its report was lost.
    err << "chstate: could not write the output (" << std::strerror(errno) << ")\n";
    return kExitInternal;
  }
  return kExitOk;
}

}  // namespace chstate::cli
