// Fuzzes SQL generation (core/statements.h, core/quoting.h) with hostile
// state ids, glob patterns, lock ids, schema and table names.
//
// Properties, for every statement and both dialects:
// - the SQL is printable ASCII (plus newline);
// - its shape does not depend on the values: with every string literal
//   replaced by '?' and every 16-hex-digit lock hash by H, the statement is
//   identical to the one built from harmless values ("statements unchanged");
// - the literal or parameter carrying a value decodes back to exactly the
//   input bytes (byte-exact round trip);
// - the URL parameters have the same names as for harmless values;
// - a schema or table is accepted only when it is a plain identifier;
// - GlobToLike matches exactly what the glob matches (over a small alphabet
//   rich in metacharacters).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "core/quoting.h"
#include "core/response.h"
#include "core/statements.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using chstate::SqlRequest;

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Splits a statement into its skeleton and its decoded string literals, the
// way ClickHouse's lexer reads '...' (backslash escapes, \xHH).
struct Parsed {
  std::string skeleton;
  std::vector<std::string> literals;
  bool ok = true;
};

Parsed Lex(const std::string& sql) {
  Parsed p;
  size_t i = 0;
  while (i < sql.size()) {
    char c = sql[i];
    if (c == '`') {  // identifiers are copied as they are (validated, no escapes)
      size_t end = sql.find('`', i + 1);
      if (end == std::string::npos) {
        p.ok = false;
        return p;
      }
      p.skeleton.append(sql, i, end - i + 1);
      i = end + 1;
      continue;
    }
    if (c != '\'') {
      p.skeleton.push_back(c);
      ++i;
      continue;
    }
    std::string lit;
    ++i;
    bool closed = false;
    while (i < sql.size()) {
      char d = sql[i];
      if (d == '\'') {
        closed = true;
        ++i;
        break;
      }
      if (d == '\\') {
        if (i + 1 >= sql.size()) break;
        char e = sql[i + 1];
        if (e == 'x' && i + 3 < sql.size() && HexValue(sql[i + 2]) >= 0 && HexValue(sql[i + 3]) >= 0) {
          lit.push_back(static_cast<char>(HexValue(sql[i + 2]) * 16 + HexValue(sql[i + 3])));
          i += 4;
          continue;
        }
        switch (e) {
          case 'n': lit.push_back('\n'); break;
          case 't': lit.push_back('\t'); break;
          case 'r': lit.push_back('\r'); break;
          case '0': lit.push_back('\0'); break;
          case 'b': lit.push_back('\b'); break;
          case 'f': lit.push_back('\f'); break;
          default: lit.push_back(e);  // \\ \' and any other: the character itself
        }
        i += 2;
        continue;
      }
      lit.push_back(d);
      ++i;
    }
    if (!closed) {
      p.ok = false;
      return p;
    }
    p.literals.push_back(lit);
    p.skeleton.append("'?'");
  }
  return p;
}

// Lock table names carry a hash of the id; it is not part of the shape.
std::string NormaliseHashes(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    while (j < s.size() && HexValue(s[j]) >= 0 && !(s[j] >= 'A' && s[j] <= 'F')) ++j;
    if (j - i == 16) {
      out.append("H");
      i = j;
    } else if (j > i) {
      out.append(s, i, j - i);
      i = j;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

std::vector<std::string> ParamNames(const SqlRequest& r) {
  std::vector<std::string> names;
  for (const auto& kv : r.url_params) names.push_back(kv.first);
  return names;
}

const std::string* Param(const SqlRequest& r, const std::string& name) {
  for (const auto& kv : r.url_params) {
    if (kv.first == name) return &kv.second;
  }
  return nullptr;
}

bool HasLiteral(const Parsed& p, const std::string& value) {
  for (const std::string& l : p.literals) {
    if (l == value) return true;
  }
  return false;
}

// Compares a statement built from hostile values with the same statement
// built from harmless ones; returns the hostile statement's lexed form.
Parsed SameShape(const SqlRequest& hostile, const SqlRequest& benign) {
  FUZZ_CHECK(chstate_fuzz::PrintableAscii(hostile.sql, true), hostile.purpose + ": " + hostile.sql);
  Parsed h = Lex(hostile.sql);
  Parsed b = Lex(benign.sql);
  FUZZ_CHECK(h.ok && b.ok, hostile.purpose + ": unterminated quote in " + hostile.sql);
  FUZZ_CHECK(NormaliseHashes(h.skeleton) == NormaliseHashes(b.skeleton),
             hostile.purpose + ": the values changed the statement:\n  " + hostile.sql + "\n  vs " + benign.sql);
  FUZZ_CHECK(ParamNames(hostile) == ParamNames(benign), hostile.purpose + ": URL parameters changed");
  FUZZ_CHECK(hostile.idempotent == benign.idempotent && hostile.purpose == benign.purpose);
  return h;
}

// The value must come back byte-exact from the literal (18.x) or the
// parameter (modern).
void CarriesValue(const SqlRequest& r, const Parsed& p, const std::string& param, const std::string& value) {
  const std::string* v = Param(r, "param_" + param);
  if (v != nullptr) {
    FUZZ_CHECK(chstate_fuzz::PrintableAscii(*v), r.purpose + ": parameter not ASCII");
    FUZZ_CHECK(chstate::UnescapeTsvField(*v) == value, r.purpose + ": parameter does not decode to the value");
  } else {
    FUZZ_CHECK(HasLiteral(p, value), r.purpose + ": no literal decodes to the value in " + r.sql);
  }
}

// Reads a backquoted identifier at sql[i] (ClickHouse unescapes \\, \` and
// \xHH inside backquotes too); *end is one past the closing backquote.
std::optional<std::string> Backquoted(const std::string& sql, size_t i, size_t* end) {
  if (i >= sql.size() || sql[i] != '`') return std::nullopt;
  std::string out;
  for (++i; i < sql.size(); ++i) {
    if (sql[i] == '`') {
      *end = i + 1;
      return out;
    }
    if (sql[i] == '\\' && i + 1 < sql.size()) {
      if (sql[i + 1] == 'x' && i + 3 < sql.size() && HexValue(sql[i + 2]) >= 0 && HexValue(sql[i + 3]) >= 0) {
        out.push_back(static_cast<char>(HexValue(sql[i + 2]) * 16 + HexValue(sql[i + 3])));
        i += 3;
      } else {
        out.push_back(sql[++i]);
      }
      continue;
    }
    out.push_back(sql[i]);
  }
  return std::nullopt;
}

void CheckDropTable(const chstate::Statements& st, const std::string& name) {
  const SqlRequest r = st.DropTable(name);
  const SqlRequest benign = st.DropTable("x");
  FUZZ_CHECK(chstate_fuzz::PrintableAscii(r.sql), "drop_table: " + r.sql);
  const std::string prefix = "DROP TABLE IF EXISTS `" + st.schema() + "`.";
  FUZZ_CHECK(r.sql.rfind(prefix, 0) == 0, r.sql);
  size_t end = 0;
  std::optional<std::string> ident = Backquoted(r.sql, prefix.size(), &end);
  FUZZ_CHECK(ident.has_value() && *ident == name, "drop_table: the name does not stay one identifier: " + r.sql);
  FUZZ_CHECK(r.sql.substr(end) == benign.sql.substr(prefix.size() + 3), "drop_table: statement changed: " + r.sql);
  FUZZ_CHECK(ParamNames(r) == ParamNames(benign));
}

// Reference glob matcher: '*' any run of bytes, '?' one byte.
bool GlobMatch(const std::string& g, size_t gi, const std::string& s, size_t si) {
  if (gi == g.size()) return si == s.size();
  if (g[gi] == '*') {
    for (size_t k = si; k <= s.size(); ++k) {
      if (GlobMatch(g, gi + 1, s, k)) return true;
    }
    return false;
  }
  if (si == s.size()) return false;
  if (g[gi] == '?' || g[gi] == s[si]) return GlobMatch(g, gi + 1, s, si + 1);
  return false;
}

// ClickHouse LIKE: '%' any run, '_' one character, backslash escapes the next.
bool LikeMatch(const std::string& p, size_t pi, const std::string& s, size_t si) {
  if (pi == p.size()) return si == s.size();
  if (p[pi] == '%') {
    for (size_t k = si; k <= s.size(); ++k) {
      if (LikeMatch(p, pi + 1, s, k)) return true;
    }
    return false;
  }
  if (si == s.size()) return false;
  if (p[pi] == '_') return LikeMatch(p, pi + 1, s, si + 1);
  if (p[pi] == '\\' && pi + 1 < p.size()) {
    return p[pi + 1] == s[si] && LikeMatch(p, pi + 2, s, si + 1);
  }
  return p[pi] == s[si] && LikeMatch(p, pi + 1, s, si + 1);
}

std::string SmallAlphabet(FuzzedDataProvider& in, size_t max) {
  static const char kAlphabet[] = "ab*?%_\\'";
  std::string out;
  size_t n = in.ConsumeIntegralInRange<size_t>(0, max);
  for (size_t i = 0; i < n; ++i) out.push_back(kAlphabet[in.ConsumeIntegralInRange<int>(0, 7)]);
  return out;
}

bool IsIdentifier(const std::string& s) {
  if (s.empty() || s.size() > chstate::kMaxIdentifierLength) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const chstate::Dialect dialect = in.ConsumeBool() ? chstate::Dialect::kModern : chstate::Dialect::kClickHouse18;
  const std::string schema = in.ConsumeRandomLengthString(80);
  const std::string table = in.ConsumeRandomLengthString(80);
  const std::string id = in.ConsumeRandomLengthString(4096);
  const std::string glob = in.ConsumeRandomLengthString(256);
  const std::string lock_id = in.ConsumeRandomLengthString(64);
  const std::string json = in.ConsumeRandomLengthString(1024);
  const std::string name = in.ConsumeRandomLengthString(128);
  const int64_t n = in.ConsumeIntegralInRange<int64_t>(0, 1 << 30);

  absl::StatusOr<chstate::Statements> made = chstate::Statements::Create(dialect, schema, table);
  FUZZ_CHECK(made.ok() == (IsIdentifier(schema) && IsIdentifier(table)), "schema/table validation: " + schema);
  if (!made.ok()) FUZZ_CHECK(made.status().code() == absl::StatusCode::kInvalidArgument);
  const chstate::Statements st = made.ok() ? *made : *chstate::Statements::Create(dialect, "meltano", "state");
  const std::string x = "x";

  if (!id.empty()) {
    Parsed p = SameShape(st.GetState(id), st.GetState(x));
    CarriesValue(st.GetState(id), p, "state_id", id);
    p = SameShape(st.DeleteState(id), st.DeleteState(x));
    CarriesValue(st.DeleteState(id), p, "state_id", id);
    SqlRequest ins = st.InsertState(id, json, std::nullopt, "t");
    p = SameShape(ins, st.InsertState(x, x, std::nullopt, "t"));
    FUZZ_CHECK(p.literals.size() == 2 && p.literals[0] == id && p.literals[1] == json, "insert values changed");
    p = SameShape(st.InsertState(id, std::nullopt, json, "t"), st.InsertState(x, std::nullopt, x, "t"));
    FUZZ_CHECK(p.literals.size() == 2 && p.literals[0] == id && p.literals[1] == json, "insert values changed");

    p = SameShape(st.CreateLock(id, lock_id, n), st.CreateLock(x, x, n));
    FUZZ_CHECK(HasLiteral(p, lock_id));
    p = SameShape(st.RenewLock(id, lock_id, n), st.RenewLock(x, x, n));
    FUZZ_CHECK(HasLiteral(p, lock_id));
    p = SameShape(st.InspectLock(id), st.InspectLock(x));
    FUZZ_CHECK(HasLiteral(p, st.LockTableName(id)) && HasLiteral(p, st.schema()));
    SameShape(st.DropLock(id), st.DropLock(x));
    SameShape(st.EntombLock(id, lock_id), st.EntombLock(x, x));
    FUZZ_CHECK(st.TombstoneName(id, lock_id).rfind(st.LockTableName(id) + "_dead_", 0) == 0);
  }

  // Patterns: the LIKE text is carried exactly and means what the glob means.
  SqlRequest list = st.ListStateIds(glob);
  if (glob == "*") {
    SameShape(list, st.ListStateIds(std::nullopt));
  } else {
    Parsed p = SameShape(list, st.ListStateIds(std::string("x")));
    CarriesValue(list, p, "pattern", chstate::GlobToLike(glob));
  }
  SameShape(st.ListOldTombstones(n), st.ListOldTombstones(n));
  // A table name read back from the server (tombstones) must stay one
  // identifier in the DROP statement.
  CheckDropTable(st, name);

  const std::string small_glob = SmallAlphabet(in, 8);
  const std::string candidate = SmallAlphabet(in, 10);
  FUZZ_CHECK(GlobMatch(small_glob, 0, candidate, 0) == LikeMatch(chstate::GlobToLike(small_glob), 0, candidate, 0),
             "glob " + small_glob + " and LIKE " + chstate::GlobToLike(small_glob) + " disagree on " + candidate);
  return 0;
}
