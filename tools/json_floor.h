// What nlohmann/json alone costs on an export document (tools/json_floor.cc).
#ifndef CHSTATE_TOOLS_JSON_FLOOR_H_
#define CHSTATE_TOOLS_JSON_FLOOR_H_

#include <optional>
#include <string>
#include <vector>

namespace chstate::tools {

// The non-empty sides of an export document as `chstate export` writes it
// (one entry a line), each as the table stores it (dump()'s text; an empty
// side is stored as NULL and needs no check). Nothing when the text is not
// such a document.
std::optional<std::vector<std::string>> StoredSides(const std::string& document);

// One SAX pass of the library over `text`, with a handler that keeps
// nothing: whether it is valid JSON.
bool Pass(const std::string& text);

}  // namespace chstate::tools

#endif  // CHSTATE_TOOLS_JSON_FLOOR_H_
