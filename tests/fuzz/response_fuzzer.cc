// Fuzzes ClickHouse answer parsing (core/response.h, and the lock
// inspection decoder in core/lock_common.h).
//
// Properties: nothing crashes on any status, header or body; an error
// answer is never OK; rows always have the requested number of fields;
// TabSeparated rows written by a reference escaper parse back byte-exact;
// the same rows cut short, or followed by an exception (as after HTTP 200),
// are an error and never a row; an exception code is only reported when
// the body really carries one.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "core/lock_machine.h"
#include "core/response.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// What ClickHouse writes for one TabSeparated field.
std::string Escape(const std::optional<std::string>& v) {
  if (!v) return "\\N";
  std::string out;
  for (char c : *v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);

  // 1. Any answer.
  chstate::SqlResponse r;
  r.transport_ok = in.ConsumeBool();
  r.http_status = in.ConsumeIntegralInRange<int>(0, 600);
  r.exception_code_header = in.ConsumeRandomLengthString(12);
  r.body = in.ConsumeRandomLengthString(2048);
  const size_t columns = in.ConsumeIntegralInRange<size_t>(1, 6);
  absl::Status st = chstate::CheckResponse(r, "fuzzing");
  if (!r.transport_ok) FUZZ_CHECK(st.code() == absl::StatusCode::kUnavailable);
  if (r.transport_ok && r.http_status != 200) FUZZ_CHECK(!st.ok(), "a non-200 answer passed as OK");
  if (std::optional<int> code = chstate::ClickHouseCode(st)) FUZZ_CHECK(!st.ok());
  std::optional<int> body_code = chstate::ParseExceptionCode(r.body);
  if (body_code) FUZZ_CHECK(r.body.find("Code: ") != std::string::npos);

  absl::StatusOr<chstate::Rows> rows = chstate::ParseTabSeparated(r.body, columns);
  if (rows.ok()) {
    for (const chstate::Row& row : *rows) FUZZ_CHECK(row.size() == columns);
    FUZZ_CHECK(r.body.empty() || r.body.back() == '\n');
  } else {
    FUZZ_CHECK(rows.status().code() == absl::StatusCode::kDataLoss ||
               rows.status().code() == absl::StatusCode::kInternal);
  }
  (void)chstate::ParseLockInspection(r.body);
  (void)chstate::UnescapeTsvField(r.body);

  // 2. Rows written the way the server writes them.
  chstate::Rows want;
  const size_t ncols = in.ConsumeIntegralInRange<size_t>(2, 5);
  const size_t nrows = in.ConsumeIntegralInRange<size_t>(0, 6);
  std::string body;
  for (size_t i = 0; i < nrows; ++i) {
    chstate::Row row;
    for (size_t c = 0; c < ncols; ++c) {
      std::optional<std::string> v;
      if (!in.ConsumeBool()) v = in.ConsumeRandomLengthString(64);
      body += (c ? "\t" : "") + Escape(v);
      row.push_back(v);
    }
    body += "\n";
    want.push_back(row);
  }
  absl::StatusOr<chstate::Rows> got = chstate::ParseTabSeparated(body, ncols);
  FUZZ_CHECK(got.ok(), "well-formed rows rejected: " + std::string(got.status().message()));
  FUZZ_CHECK(*got == want, "rows did not round-trip");

  // 3. The same answer cut anywhere but at a line end, or with an exception
  // appended (a server failing after HTTP 200), is never a complete answer.
  if (body.size() > 1) {
    const std::string shortened = body.substr(0, in.ConsumeIntegralInRange<size_t>(1, body.size() - 1));
    // (A cut right after a line end is a shorter valid answer; the transport's
    // Content-Length or chunking catches that one.)
    if (shortened.back() != '\n') {
      FUZZ_CHECK(!chstate::ParseTabSeparated(shortened, ncols).ok(), "a truncated answer parsed");
    }
  }
  const int code = in.ConsumeIntegralInRange<int>(1, 999);
  const std::string exception = in.ConsumeBool()
                                    ? "Code: " + std::to_string(code) + ", e.displayText() = DB::Exception: boom"
                                    : "Code: " + std::to_string(code) + ". DB::Exception: boom. (SOME_ERROR)";
  for (const std::string& tail : {exception, exception + "\n"}) {
    absl::StatusOr<chstate::Rows> failed = chstate::ParseTabSeparated(body + tail, ncols);
    FUZZ_CHECK(!failed.ok(), "an exception after the rows parsed as a row: " + body + tail);
    FUZZ_CHECK(chstate::ClickHouseCode(failed.status()) == code, "the exception's code was not reported");
  }
  return 0;
}
