// Scripted ClickHouse answers for tests that drive the core without a server:
// a result, a server exception (18.x text), and the two kinds of transport
// failure a host reports.
//
//   task->OnResponse(chstate::testing::Ok("18.16.1\t1\n"), inputs);
//   task->OnResponse(chstate::testing::Err(500, 57, "Table ... already exists"), inputs);
#ifndef CHSTATE_CORE_TESTING_RESPONSES_H_
#define CHSTATE_CORE_TESTING_RESPONSES_H_

#include <string>
#include <utility>

#include "core/sql_request.h"

namespace chstate::testing {

// HTTP 200 with `body`.
inline SqlResponse Ok(std::string body = "") {
  SqlResponse r;
  r.http_status = 200;
  r.body = std::move(body);
  return r;
}

// A ClickHouse exception with `code`, as 18.x words it.
inline SqlResponse Err(int status, int code, const std::string& text) {
  SqlResponse r;
  r.http_status = status;
  r.body = "Code: " + std::to_string(code) + ", e.displayText() = DB::Exception: " + text + ", e.what() = x\n";
  return r;
}

// No connection: the request certainly never left.
inline SqlResponse Refused() {
  SqlResponse r;
  r.transport_ok = false;
  r.transport_error = "connection refused (127.0.0.1:1)";
  return r;
}

// Sent, then the connection broke: the statement may have run.
inline SqlResponse Lost() {
  SqlResponse r;
  r.transport_ok = false;
  r.maybe_delivered = true;
  r.transport_error = "connection reset while reading the answer (127.0.0.1:1)";
  return r;
}

}  // namespace chstate::testing

#endif  // CHSTATE_CORE_TESTING_RESPONSES_H_
