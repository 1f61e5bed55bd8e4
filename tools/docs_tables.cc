// Prints, as one JSON document, every table the docs show that the code
// holds: the settings and the renamed settings (core/settings.h, through the
// same SettingsTableJson the hosts bind), the defaults (core/defaults.h), the
// verbs (core/verbs.h, through VerbsJson), the ClickHouse error codes the core
// interprets (core/clickhouse_errors.h), the CLI's exit code for every status
// code (hosts/native/cli.h ExitCodeFor) and the CLI's own --help texts.
// tools/gendocs renders them into the docs between markers; nothing here is
// written by hand.
//
//   bazel run //tools:docs_tables > tables.json
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/clickhouse_errors.h"
#include "core/defaults.h"
#include "core/settings.h"
#include "hosts/common/protocol.h"
#include "hosts/native/cli.h"
#include <nlohmann/json.hpp>

namespace {

using json = nlohmann::json;

// The text `chstate ARGS...` prints on stdout, and its exit code.
std::pair<std::string, int> Cli(const std::vector<std::string>& args) {
  std::istringstream in;
  std::ostringstream out, err;
  const int code = chstate::cli::Main(args, {}, in, out, err);
  return {out.str() + err.str(), code};
}

// The command names of `chstate --help`'s "Commands:" section, in order.
std::vector<std::string> CommandNames(const std::string& help) {
  std::vector<std::string> names;
  bool in_commands = false;
  for (absl::string_view line : absl::StrSplit(help, '\n')) {
    if (line == "Commands:") {
      in_commands = true;
      continue;
    }
    if (!in_commands) continue;
    if (line.empty()) break;
    // "  NAME ..." (a wrapped summary line starts with more spaces).
    if (absl::StartsWith(line, "  ") && !absl::StartsWith(line, "   ")) {
      line.remove_prefix(2);
      names.emplace_back(line.substr(0, line.find(' ')));
    }
  }
  return names;
}

}  // namespace

int main() {
  json doc;
  json settings = chstate::protocol::SettingsTableJson();
  // The smallest value each setting accepts, beside the protocol's columns.
  for (size_t i = 0; i < chstate::kSettingsCount; ++i) settings["settings"][i]["min"] = chstate::kSettings[i].min;
  doc["settings"] = settings["settings"];
  doc["renamed"] = settings["renamed"];

  json defaults = json::array();
  for (const chstate::DefaultSetting& d : chstate::kDefaults) {
    defaults.push_back({{"name", d.name}, {"value", d.value}, {"unit", d.unit}, {"meaning", d.meaning}});
  }
  doc["defaults"] = defaults;

  doc["verbs"] = chstate::protocol::VerbsJson()["verbs"];

  json codes = json::array();
  for (const chstate::ch::ErrorCode& e : chstate::ch::kInterpreted) {
    codes.push_back({{"code", e.code}, {"name", e.name}, {"handling", e.handling}});
  }
  doc["clickhouse_codes"] = codes;

  json exits = json::array();
  for (int c = 0; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    exits.push_back({{"status", absl::StatusCodeToString(code)}, {"exit_code", chstate::cli::ExitCodeFor(code)}});
  }
  doc["exit_codes"] = exits;

  const auto [general, general_code] = Cli({"--help"});
  if (general_code != 0) {
    std::cerr << "docs_tables: chstate --help exited " << general_code << "\n";
    return 1;
  }
  json help = json::object();
  help[""] = general;
  json order = json::array();
  for (const std::string& name : CommandNames(general)) {
    const auto [text, code] = Cli({name, "--help"});
    if (code != 0) {
      std::cerr << "docs_tables: chstate " << name << " --help exited " << code << "\n";
      return 1;
    }
    help[name] = text;
    order.push_back(name);
  }
  doc["cli_help"] = help;
  doc["cli_commands"] = order;
  doc["cli_version"] = absl::StripSuffix(absl::StripPrefix(Cli({"--version"}).first, "chstate "), "\n");

  std::cout << doc.dump(1) << "\n";
  return 0;
}
