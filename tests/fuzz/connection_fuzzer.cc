// Fuzzes the store as hosts pump it (core/connection.h): the input chooses
// which operations are started (every store operation, on two ids: set and
// delete take the id's lock unless a scope holds it, merge from the other
// id, close; a release with the right or a wrong lock id, abandons), the
// answer to each request (results, lock-table rows naming us or another
// holder, ClickHouse errors, lost and refused requests, garbage) and how the
// clock moves (time jumps, timeouts fired early, on time and late).
//
// The host sometimes polls requests late (several inputs after they were
// made), so that an abandon, an answer or a timeout can come between the
// request being made and being sent.
//
// Properties, checked after every input (the connection's invariants,
// core/connection_test.cc "ConnectionInvariant"):
// - at most one request in flight, and only for the operation that runs;
//   the answer to it is accepted (also before the host polled it, and then
//   it is sent no more), an answer for any other op is refused;
// - nothing is sent for an abandoned op, however late the host polls;
// - a stale answer (a second answer to the request just answered, while its
//   op waits for a timer or has ended) is refused and changes nothing;
// - no timer is left for an op that ended or was abandoned: with no op
//   running, PollTimeout is only the store's own renewal, and while a
//   request is in flight there is no timer at all;
// - every request carries an attempt within the policy and a deadline after
//   the time it was made;
// - every started op ends with exactly one event, and an abandoned op with
//   none; renewal events only ever report a lost lock;
// - when no op runs and the store holds no live lock, nothing is asked of the
//   host: no request, no timeout;
// - nothing crashes (ASan/UBSan), however the operations interleave.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <fuzzer/FuzzedDataProvider.h>

#include "absl/strings/str_cat.h"
#include "core/connection.h"
#include "core/lock.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using chstate::Connection;
using chstate::Inputs;
using chstate::OpEvent;
using chstate::SqlResponse;
using chstate::Transmit;

const std::string kRandom(32, '\x5a');
const char* const kIds[] = {"dev:a", "dev:b"};

SqlResponse Ok(std::string body) {
  SqlResponse r;
  r.http_status = 200;
  r.body = std::move(body);
  return r;
}

SqlResponse Err(int code) {
  SqlResponse r;
  r.http_status = code == 60 || code == 81 ? 404 : 500;
  r.exception_code_header = absl::StrCat(code);
  r.body = absl::StrCat("Code: ", code, ". DB::Exception: fuzzed (X) (version 23.8.2.7 (official build))\n");
  return r;
}

// The lock table as an inspection reads it.
SqlResponse Rows(const std::string& holder, int64_t created_s, int64_t now_s, int64_t stale_s) {
  return Ok(absl::StrCat(holder, "\t0\t", created_s, "\t", now_s, "\t", stale_s, "\n\t255\t", created_s, "\t", now_s,
                         "\t0\n"));
}

SqlResponse AnswerFor(FuzzedDataProvider& in, const Transmit& t, const std::string& lock_id, int64_t now_ms) {
  const int64_t now_s = now_ms / 1000;
  switch (in.ConsumeIntegralInRange<int>(0, 11)) {
    case 0: {
      SqlResponse r;
      r.transport_ok = false;
      r.maybe_delivered = true;
      r.transport_error = "connection reset (fuzz)";
      return r;
    }
    case 1: {
      SqlResponse r;
      r.transport_ok = false;
      r.transport_error = "connection refused (fuzz)";
      return r;
    }
    case 2: return Err(in.PickValueInArray({57, 60, 81, 159, 218, 241, 242, 319, 516}));
    case 3: return Ok(in.ConsumeRandomLengthString(200));
    case 4: return Rows(lock_id, now_s - in.ConsumeIntegralInRange<int64_t>(0, 20), now_s, 30);
    case 5: return Rows("someone-else", now_s - in.ConsumeIntegralInRange<int64_t>(0, 400), now_s, 30);
    case 6: return Ok("");
    default:
      break;
  }
  // The answer a healthy server gives, by purpose.
  const std::string& p = t.request.purpose;
  if (p == "select_version") return Ok(in.ConsumeBool() ? "18.16.1\t1\n" : "26.9.2.1\t1\n");
  if (p == "inspect_lock") return Rows(lock_id, now_s - 1, now_s, 30);
  if (p == "get_state") return Ok(in.ConsumeBool() ? "{}\t{\"singer_state\":{\"a\":1}}\n" : "");
  if (p == "list_state_ids") return Ok("dev:a\t1\ndev:b\t1\n");
  if (p == "count_states") return Ok("2\n");
  if (p == "pending_mutations") return Ok("0\n");
  return Ok("");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  chstate::StoreOptions options;
  options.lock.stale_ms = in.ConsumeIntegralInRange<int64_t>(1000, 60000);
  options.lock.retry_ms = in.ConsumeIntegralInRange<int64_t>(10, 2000);
  options.lock.timeout_ms = in.ConsumeIntegralInRange<int64_t>(0, 20000);
  absl::StatusOr<std::unique_ptr<chstate::Store>> store = chstate::Store::Create(options);
  FUZZ_CHECK(store.ok(), store.status().ToString());
  Connection conn(*std::move(store));
  const std::string lock_id = chstate::MakeLockId(kRandom);
  const chstate::TransportPolicy policy;

  int64_t now = in.ConsumeIntegralInRange<int64_t>(0, int64_t{1} << 40);
  std::optional<Transmit> in_flight;
  std::set<uint64_t> started;
  std::set<uint64_t> running;    // started, no event yet
  std::set<uint64_t> abandoned;
  std::set<uint64_t> ended;

  // The last request answered, while its op had no newer request.
  std::optional<uint64_t> last_answered;

  int64_t polled_at = now;  // requests made before this were polled then
  auto poll_transmits = [&] {
    while (std::optional<Transmit> t = conn.PollTransmit()) {
      FUZZ_CHECK(!in_flight.has_value(), "two requests in flight");
      FUZZ_CHECK(t->request.attempt >= 1 && t->request.attempt <= policy.attempts,
                 absl::StrCat("attempt ", t->request.attempt));
      // Made at some time since the last poll: its deadline is its timeout after that.
      const int64_t made_ms = t->deadline_ms - t->request.timeout_ms;
      FUZZ_CHECK(t->request.timeout_ms > 0 && made_ms >= polled_at && made_ms <= now,
                 "a deadline not a timeout after the time the request was made");
      // A started op sends only while it runs; any other op is the
      // connection's own renewal.
      FUZZ_CHECK(running.count(t->op) == 1 || started.count(t->op) == 0, "a request for an op that ended");
      FUZZ_CHECK(abandoned.count(t->op) == 0, absl::StrCat("a request sent for abandoned op ", t->op));
      if (last_answered == t->op) last_answered.reset();
      in_flight = std::move(t);
    }
    polled_at = now;
  };

  auto drain = [&](bool poll_now) {
    if (poll_now) poll_transmits();
    while (std::optional<OpEvent> e = conn.PollEvent()) {
      FUZZ_CHECK(abandoned.count(e->op) == 0, "an event for an abandoned op");
      FUZZ_CHECK(ended.insert(e->op).second, "two events for one op");
      if (e->renewal) {
        FUZZ_CHECK(!e->ok, "a renewal that went well reported");
      } else {
        FUZZ_CHECK(running.erase(e->op) == 1, "an event for an op not running");
      }
      if (!e->ok) FUZZ_CHECK(!e->status.ok(), "a failure without a status");
    }
    if (in_flight) FUZZ_CHECK(!conn.PollTimeout().has_value(), "a timer while a request is in flight");
    if (conn.idle()) {
      FUZZ_CHECK(conn.PollTimeout() == conn.store().NextTimeoutMs(),
                 "a timer left for an op that ended (idle, and not the store's renewal)");
      FUZZ_CHECK(!in_flight.has_value(), "a request in flight while idle");
      bool live = conn.store().LeaseValid(kIds[0], now) || conn.store().LeaseValid(kIds[1], now);
      if (!conn.store().NextTimeoutMs().has_value()) {
        FUZZ_CHECK(!conn.PollTimeout().has_value(), "a timeout while idle with no lock to renew");
        FUZZ_CHECK(!live, "a valid lease the store never renews");
      }
    }
  };

  for (int step = 0; step < 400 && in.remaining_bytes() > 0; ++step) {
    Inputs at{now, kRandom};
    // One input in four leaves the requests made unpolled until later.
    const bool poll_now = in.ConsumeIntegralInRange<int>(0, 3) != 0;
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 0:
      case 1: {  // start an operation
        chstate::Store& s = conn.store();
        const std::string id = kIds[in.ConsumeIntegralInRange<int>(0, 1)];
        chstate::MeltanoState st{id, nlohmann::json::object(),
                                 nlohmann::json::parse(R"({"singer_state":{"x":1}})")};
        std::unique_ptr<chstate::Task> task;
        switch (in.ConsumeIntegralInRange<int>(0, 13)) {
          case 0: task = s.Get(id); break;
          case 1: task = s.Set(st); break;
          case 2: task = s.Update(st); break;
          case 3: task = s.Delete(id); break;
          case 4: task = s.MergeFrom(kIds[id == kIds[0] ? 1 : 0], id, in.ConsumeBool()); break;
          case 5: task = s.List(std::nullopt); break;
          case 6: task = s.AcquireLock(id); break;
          case 7: task = s.ReleaseLock(id, in.ConsumeBool() ? lock_id : "not-ours"); break;
          case 8: task = s.RenewLock(id); break;
          case 9: task = s.Tick(); break;
          case 10: task = s.Close(); break;
          case 11: task = s.Copy(kIds[0], kIds[1]); break;
          case 12: task = s.Ping(); break;
          default: task = s.ClearAll(); break;
        }
        const uint64_t op = conn.Start(std::move(task), at);
        started.insert(op);
        running.insert(op);
        break;
      }
      case 2:
      case 3:
      case 4:
      case 5: {  // answer the request in flight
        if (!in_flight) {
          // The host answers the oldest running op before polling its
          // request (accepted only when that op awaits one): the request
          // answered must not be sent after all.
          if (running.empty() || !in.ConsumeBool()) break;
          const uint64_t op = *running.begin();
          Transmit unseen;
          unseen.op = op;
          if (conn.HandleResponse(op, AnswerFor(in, unseen, lock_id, now), at).ok()) last_answered = op;
          break;
        }
        Transmit t = *std::move(in_flight);
        in_flight.reset();
        absl::Status st = conn.HandleResponse(t.op, AnswerFor(in, t, lock_id, now), at);
        FUZZ_CHECK(abandoned.count(t.op) == 1 || st.ok(), st.ToString());
        last_answered = t.op;
        break;
      }
      case 6: {  // an answer for some other op, or a stale one, is refused
        // Only what the host has seen is judged: poll first.
        poll_transmits();
        uint64_t op = in.ConsumeIntegralInRange<uint64_t>(0, 40);
        const bool stale = last_answered.has_value() && in.ConsumeBool();
        if (stale) op = *last_answered;
        if (in_flight && op == in_flight->op) break;
        const std::optional<int64_t> timer = conn.PollTimeout();
        absl::Status st = conn.HandleResponse(op, Ok(""), at);
        FUZZ_CHECK(!st.ok(), absl::StrCat(stale ? "a stale answer for op " : "an answer for op ", op,
                                          " accepted while it sent nothing"));
        FUZZ_CHECK(!conn.PollTransmit().has_value(), "a refused answer made a request");
        FUZZ_CHECK(conn.PollTimeout() == timer, "a refused answer moved the timer");
        break;
      }
      case 7: {  // abandon the request's op or another
        if (running.empty()) break;
        uint64_t op = in.ConsumeBool() ? *running.begin() : *running.rbegin();
        running.erase(op);
        abandoned.insert(op);
        if (in_flight && in_flight->op == op) in_flight.reset();
        conn.Abandon(op, at);
        break;
      }
      case 8: {  // time passes; the host calls back at, before or after the timeout
        std::optional<int64_t> to = conn.PollTimeout();
        int64_t target = to ? *to + in.ConsumeIntegralInRange<int64_t>(-50, 50)
                            : now + in.ConsumeIntegralInRange<int64_t>(0, 5000);
        if (target > now) now = target;
        conn.HandleTimeout({now, kRandom});
        break;
      }
      default:  // a long pause (a stalled host)
        now += in.ConsumeIntegralInRange<int64_t>(0, 120000);
        break;
    }
    drain(poll_now);
  }
  drain(true);
  return 0;
}
