// An operation as an explicit state machine. A store operation (get,
// update, export, ...) and each part it is made of (reading a state, a
// quorum write, taking the id's lock) is an Op: its `Resume` is one switch
// over its stages, read top to bottom, and `Where` says in words which stage
// it is in. An op never blocks, sleeps or sends. It returns what it needs
// next (a request answered, a wait, a part run first) and is resumed when
// that is done; Task (core/task.h) runs the stack of an operation's parts
// and applies the transport policy to every request, so that a trace of
// where a task is reads like a call stack:
//
//   update "dev:tap-to-target" (under the lock) > writing state "dev:tap-to-target" (waiting out code 286)
//
// A part that fails fails the op that asked for it too (Next::Call), unless
// that op asked to hear about it (Next::Try): an op that must clean up, as
// the one holding a lock for its body, tries its parts.
//
// An op's stage names what it waits for, so `case Stage::kReading:` is
// where it goes on once the read is done, and Where() can say what it is
// doing:
//
//   class GetOp final : public StorePart {
//     Next Resume(const Reply& r) override {
//       switch (stage_) {
//         case Stage::kStart:
//           stage_ = Stage::kConnecting;
//           return Next::Call(part::Connect(s_));
//         case Stage::kConnecting:
//           stage_ = Stage::kReading;
//           return Next::Call(part::ReadState(s_, id_, &state_));
//         case Stage::kReading: ...  // state_ holds what was read
//       }
//     }
//   };
#ifndef CHSTATE_CORE_OP_H_
#define CHSTATE_CORE_OP_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "core/sql_request.h"
#include "core/timers.h"

namespace chstate {

struct Result;

// What an op is resumed with: why it runs now.
struct Reply {
  enum class Kind {
    kStart,   // the op starts
    kAnswer,  // the answer to the request it sent (after the transport policy's resends)
    kTimer,   // the wait it asked for is over
    kPart,    // the part it tried (Next::Try) ended, or the part it called (Next::Call) succeeded
  };
  Kind kind = Kind::kStart;
  const SqlResponse* answer = nullptr;  // kAnswer
  const SqlRequest* sent = nullptr;     // kAnswer: the request answered, as last sent
  absl::Status status;                  // kPart: how the part ended
  std::shared_ptr<Result> result;       // kPart: what the part ended with (Next::Done(Result)), or null
};

class Op;

// What an op needs next. Exactly one of these per Resume.
struct Next {
  enum class Kind { kSend, kWait, kCall, kTry, kDone, kFail };
  Kind kind = Kind::kFail;
  SqlRequest request;           // kSend
  TimerKind timer = TimerKind::kOpWait;  // kWait
  int64_t wait_ms = 0;          // kWait
  std::unique_ptr<Op> part;     // kCall, kTry
  std::shared_ptr<Result> result;  // kDone: the operation's result (null for a part)
  absl::Status status;          // kFail

  static Next Send(SqlRequest request);
  static Next Wait(TimerKind timer, int64_t ms);
  // Runs `part` first; resumes this op when it succeeded, fails this op
  // with the part's error when it failed.
  static Next Call(std::unique_ptr<Op> part);
  // Runs `part` first and resumes this op however it ended (Reply::status).
  static Next Try(std::unique_ptr<Op> part);
  static Next Done();
  static Next Done(Result result);
  static Next Fail(absl::Status status);
};

class Op {
 public:
  virtual ~Op() = default;
  // Called when the op starts and each time what it asked for is done.
  virtual Next Resume(const Reply& reply) = 0;
  // Where the op is, in words ("reading state \"dev:a\""), for traces and
  // for a user wondering why a run waits.
  virtual std::string Where() const = 0;
};

}  // namespace chstate

#endif  // CHSTATE_CORE_OP_H_
