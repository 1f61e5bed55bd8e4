// Escaping rules for identifiers, literals, query parameters and LIKE patterns.
// Everything that reaches SQL text from user input passes through here.
#include "core/quoting.h"

#include "absl/strings/str_cat.h"
#include "re2/re2.h"

namespace chstate {
namespace {

constexpr char kHex[] = "0123456789abcdef";

void AppendHexByte(std::string* out, unsigned char c) {
  out->push_back('\\');
  out->push_back('x');
  out->push_back(kHex[c >> 4]);
  out->push_back(kHex[c & 0xF]);
}

// Shared by literals and parameters: the only difference is whether a single
// quote needs escaping (it does inside '...', and escaping it in a parameter
// is harmless, so both escape it).
std::string EscapeBody(absl::string_view value) {
  std::string out;
  out.reserve(value.size() + 8);
  // Bytes that stand for themselves are copied a run at a time (an import's
  // INSERT quotes a hundred megabytes of JSON).
  size_t run = 0;
  auto end_run = [&](size_t i) {
    out.append(value.data() + run, i - run);
    run = i + 1;
  };
  for (size_t i = 0; i < value.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c == '\\' || c == '\'') {
      end_run(i);
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c > 0x7E) {
      end_run(i);
      AppendHexByte(&out, c);
    }
  }
  out.append(value.data() + run, value.size() - run);
  return out;
}

}  // namespace

absl::Status ValidateIdentifier(absl::string_view name, absl::string_view what) {
  static const RE2* const kIdentifier = new RE2("[A-Za-z_][A-Za-z0-9_]*");
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " name is empty; set it to a name like `meltano`"));
  }
  if (name.size() > kMaxIdentifierLength) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " name is ", name.size(),
                                                   " bytes long; the limit is ", kMaxIdentifierLength));
  }
  if (!RE2::FullMatch(name, *kIdentifier)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, " name \"", EscapeBody(name),
                     "\" is not allowed: use letters, digits and underscores, not starting with a digit"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> QuoteIdentifier(absl::string_view name, absl::string_view what) {
  absl::Status s = ValidateIdentifier(name, what);
  if (!s.ok()) return s;
  return absl::StrCat("`", name, "`");
}

absl::Status ValidateStateId(absl::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError("the state id is empty");
  if (id.size() > kMaxStateIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("the state id is ", id.size(), " bytes long; the limit is ",
                                                   kMaxStateIdLength, " bytes"));
  }
  return absl::OkStatus();
}

std::string QuoteStringLiteral(absl::string_view value) { return absl::StrCat("'", EscapeBody(value), "'"); }

std::string EscapeParamValue(absl::string_view value) { return EscapeBody(value); }

std::string GlobToLike(absl::string_view glob) {
  std::string out;
  out.reserve(glob.size() + 4);
  for (char c : glob) {
    switch (c) {
      case '*': out.push_back('%'); break;
      case '?': out.push_back('_'); break;
      case '%':
      case '_':
      case '\\':
        out.push_back('\\');
        out.push_back(c);
        break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string HexEncode(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 0xF]);
  }
  return out;
}

std::string PrintableId(absl::string_view id) {
  std::string escaped = EscapeParamValue(id.substr(0, 200));
  return id.size() > 200 ? absl::StrCat(escaped, "...") : escaped;
}

}  // namespace chstate
