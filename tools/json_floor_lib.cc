// nlohmann/json's least cost on an export document (tools/json_floor.h).
#include "tools/json_floor.h"

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace chstate::tools {
namespace {

using json = nlohmann::json;

// Takes every token and keeps none of them.
struct Discard {
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return true; }
  bool key(std::string&) { return true; }
  bool end_object() { return true; }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
};

}  // namespace

std::optional<std::vector<std::string>> StoredSides(const std::string& document) {
  std::vector<std::string> sides;
  std::size_t begin = 0;
  while (begin < document.size()) {
    std::size_t end = document.find('\n', begin);
    if (end == std::string::npos) end = document.size();
    std::string line = document.substr(begin, end - begin);
    begin = end + 1;
    while (!line.empty() && (line.back() == ',' || line.back() == ' ' || line.back() == '\r')) line.pop_back();
    if (line.empty() || line == "{" || line == "}") continue;
    json entry = json::parse("{" + line + "}", nullptr, /*allow_exceptions=*/false);
    if (entry.is_discarded() || entry.size() != 1 || !entry.begin()->is_object()) return std::nullopt;
    for (const json& side : *entry.begin()) {
      if (!side.is_object() || side.empty()) continue;
      sides.push_back(side.dump());
    }
  }
  return sides;
}

bool Pass(const std::string& text) {
  Discard discard;
  return json::sax_parse(text.data(), text.data() + text.size(), &discard);
}

}  // namespace chstate::tools
