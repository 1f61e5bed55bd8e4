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
//   class QuorumWriteOp final : public StorePart {
//     Next Resume(const Reply& r) override {
//       switch (stage_) {
//         case Stage::kSending: ...   // the write's answer: done, or a code to wait out
//         case Stage::kWaiting: ...   // the wait is over: send again
//       }
//     }
//   };
//
// Most operations do not branch: they are a fixed list of steps (connect,
// renew if due, read, write), written once as a Sequence whose steps are
// the member functions of its context:
//
//   struct Get {
//     StoreSteps& s;
//     std::string id;
//     std::optional<MeltanoState> state;
//     Next Connect(const Reply&) { return Next::Call(part::Connect(s)); }
//     Next Read(const Reply&) { return Next::Call(part::ReadState(s, id, &state)); }
//     std::string Where(size_t) const { return absl::StrCat("get \"", id, "\""); }
//   };
//   return Steps<Get>({&Get::Connect, &Get::Read}, s, id);
#ifndef CHSTATE_CORE_OP_H_
#define CHSTATE_CORE_OP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
  enum class Kind { kSend, kWait, kCall, kTry, kGoOn, kDone, kFail };
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
  // Nothing to wait for: the op is resumed at once (Reply::kPart, ok), as
  // a Sequence's step with nothing to do goes on to the next.
  static Next GoOn();
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

// An op that is a fixed list of steps, run in order: each step says what
// the op needs next, and the op is resumed with the step after it. A step
// may end the op early (Next::Done, Next::Fail); after the last step's need
// the op is done. What the steps share lives in `keep`, which the op holds,
// and which they capture by pointer. Where() asks `where` with the step
// whose need is outstanding, only when someone asks.
// An op that is a fixed list of steps run in order: each step is a member
// function of the op's context `Ctx` (what the steps share, kept in the
// op) and says what the op needs next; the op is resumed with the step
// after it. A step may end the op early (Next::Done, Next::Fail); after the
// last step's need the op is done. Where() asks Ctx::Where with the step
// whose need is outstanding, only when someone asks.
template <typename Ctx>
class Sequence final : public Op {
 public:
  using Step = Next (Ctx::*)(const Reply&);
  template <typename... A>
  explicit Sequence(std::vector<Step> steps, A&&... ctx) : ctx_{std::forward<A>(ctx)...}, steps_(std::move(steps)) {}
  Next Resume(const Reply& reply) override {
    if (next_ == steps_.size()) return Next::Done();
    return (ctx_.*steps_[next_++])(reply);
  }
  std::string Where() const override { return ctx_.Where(next_ == 0 ? 0 : next_ - 1); }

 private:
  Ctx ctx_;
  std::vector<Step> steps_;
  size_t next_ = 0;
};

// The Sequence of `steps` over a Ctx made in place from `ctx` (its members
// in order; the rest start empty).
template <typename Ctx, typename... A>
std::unique_ptr<Op> Steps(std::vector<Next (Ctx::*)(const Reply&)> steps, A&&... ctx) {
  return std::make_unique<Sequence<Ctx>>(std::move(steps), std::forward<A>(ctx)...);
}

}  // namespace chstate

#endif  // CHSTATE_CORE_OP_H_
