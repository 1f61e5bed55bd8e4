// Turning names and values into SQL that cannot change a statement's meaning.
//
//   absl::StatusOr<std::string> t = chstate::QuoteIdentifier("state");   // "`state`"
//   std::string lit = chstate::QuoteStringLiteral("it's");               // "'it\\'s'"
//   std::string like = chstate::GlobToLike("dev:*_x?");                  // "dev:%\\_x_"
//
// Literals come out as pure printable ASCII: every byte outside 0x20..0x7E is
// written as \xHH, so NUL, newlines and invalid UTF-8 survive byte-exact and no
// transport can mangle them.
#ifndef CHSTATE_CORE_QUOTING_H_
#define CHSTATE_CORE_QUOTING_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace chstate {

// Longest schema or table name accepted (the lock table adds "_lock").
inline constexpr size_t kMaxIdentifierLength = 64;

// Longest state id accepted. Modern servers receive ids as URL query
// parameters; percent-encoding triples the worst case and servers cap URLs at
// 1 MiB by default, so 128 KiB keeps every id well inside that.
inline constexpr size_t kMaxStateIdLength = 128 * 1024;

// Validates [A-Za-z_][A-Za-z0-9_]* (at most kMaxIdentifierLength bytes) and
// returns it backtick-quoted. `what` names it in the error ("schema", "table").
absl::StatusOr<std::string> QuoteIdentifier(absl::string_view name, absl::string_view what);
absl::Status ValidateIdentifier(absl::string_view name, absl::string_view what);

// Validates a state id: not empty, at most kMaxStateIdLength bytes. Any bytes
// are allowed otherwise (they are escaped wherever they go).
absl::Status ValidateStateId(absl::string_view id);

// A single-quoted ClickHouse string literal ('...'): \\ and \' escaped, bytes
// outside printable ASCII as \xHH.
std::string QuoteStringLiteral(absl::string_view value);

// A value for an HTTP query parameter (param_<name>) as ClickHouse parses it:
// the "escaped" (TabSeparated) text form, bytes outside printable ASCII as
// \xHH, backslash doubled. The transport then only URL-encodes it.
std::string EscapeParamValue(absl::string_view value);

// A state id (user data: it may hold anything) as messages show it: escaped
// as EscapeParamValue does, cut to its first 200 bytes with "..." after.
std::string PrintableId(absl::string_view id);

// Meltano's glob (`*` any run, `?` one character) as a LIKE pattern: `%`, `_`
// and `\` in the glob are escaped with a backslash so they match themselves.
std::string GlobToLike(absl::string_view glob);

// Lower-case hex of arbitrary bytes.
std::string HexEncode(absl::string_view bytes);

}  // namespace chstate

#endif  // CHSTATE_CORE_QUOTING_H_
