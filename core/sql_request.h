// The boundary between the core and a host's transport: what to send to
// ClickHouse, and what came back.
//
//   chstate::SqlRequest req = statements.GetState(id);
//   // host: POST req.sql to http(s)://host:port/?<req.url_params...>
//   chstate::SqlResponse resp;
//   resp.http_status = 200; resp.body = "...";
//
// The core never opens a socket: hosts run requests and feed responses back.
#ifndef CHSTATE_CORE_SQL_REQUEST_H_
#define CHSTATE_CORE_SQL_REQUEST_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/endpoint.h"

namespace chstate {

struct SqlRequest {
  // The statement, sent as the HTTP POST body. Pure printable ASCII plus
  // newlines: every value inside it was escaped by core/quoting.h.
  std::string sql;
  // HTTP URL query parameters: server settings and param_<name> values.
  // Values are final text; the host only percent-encodes them.
  std::vector<std::pair<std::string, std::string>> url_params;
  // True when sending it twice has the same effect as once (reads, DDL with
  // IF [NOT] EXISTS, deletes). The core (core/task.h), never the host,
  // decides whether a request is sent again after a transport failure.
  bool idempotent = true;
  // A short name for logs and test vectors ("get_state", "insert_state", ...).
  std::string purpose;
  // Set by the task that sends it: 1 for the first send, 2 for the first
  // resend after a transport failure, ...
  int attempt = 1;
  // The longest the host may take to send it and read the whole answer;
  // past it the host reports a transport failure (maybe_delivered = true).
  // 0 only for requests no task stamped (tests of statements).
  int64_t timeout_ms = 0;
  // For a request that acts under a lock (a state write, a renewal, the
  // release's DROP or end row): the lock's lease deadline, on the host's
  // clock. The task sends it, and sends it again (to any host, for any
  // reason), only before then; past it the step that made the request gets
  // its last answer, or, when it was never sent, a transport failure that
  // says so (maybe_delivered = false). 0: no deadline. The core's own
  // business: hosts are never given it.
  int64_t send_before_ms = 0;
  // Where to send it, chosen by the task (core/endpoints.h) when the store
  // was given its hosts; empty (port 0) otherwise: the host's one server.
  Endpoint endpoint;
  // Hosts it goes to only when no other host is left: those that already
  // answered a read that must reach several replicas (each_replica).
  std::vector<Endpoint> not_to;
  // A cluster-mode claims or state read (Statements::InspectClaims,
  // GetState): its answer ends with a row naming the replica that gave it,
  // and the store asks other replicas too until the answers must hold every
  // confirmed write (part::ReadEachReplica in core/store_lock.cc). The
  // core's business, like send_before_ms.
  bool each_replica = false;
};

struct SqlResponse {
  // False when no HTTP response was received (refused, reset, timeout, TLS
  // failure). `transport_error` then says what happened; http_status is 0.
  bool transport_ok = true;
  std::string transport_error;
  // True when the request may have reached the server (sent, then the
  // connection failed): a non-idempotent request's outcome is unknown.
  bool maybe_delivered = false;
  int http_status = 0;
  // The X-ClickHouse-Exception-Code header, when the server sent one.
  std::string exception_code_header;
  std::string body;
};

}  // namespace chstate

#endif  // CHSTATE_CORE_SQL_REQUEST_H_
