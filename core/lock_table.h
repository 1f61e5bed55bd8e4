// The engine both lock machines run (core/table_lock.h, core/claims_lock.h):
// a transition table of rows (state, event) -> next state, with the row's
// effect run outside the table. Internal to the core's lock.
//
// An input is first checked against the table (a state takes an input kind
// only if one of its rows does: anything else is misuse), then the machine
// classifies it into exactly one event (an answer with what the machine
// knows becomes "free", "held by a live holder", "stale", ...), and the row
// for (state, event) names the one next state and the effect. A state may be
// a decision: the machine passes through it within the same input, its
// classifier choosing the next event from the machine's named facts (a
// pending release, the deadline, the lease), as h11 fires its
// state-triggered transitions.
//
//   class TableLock : public TableDrivenLock<TableLock, TableLockState, TableLockEvent> {
//     // static const Row kRows[]; Rows(); Public(); StateName(); EventName();
//     // InputOf(); IsDecision(); Observe(); Classify(); Decide(); the effects
//   };
#ifndef CHSTATE_CORE_LOCK_TABLE_H_
#define CHSTATE_CORE_LOCK_TABLE_H_

#include <array>
#include <cstddef>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/lock_machine.h"

namespace chstate {

// How an event reaches a machine: one of the four inputs, or a decision
// taken in passing (a row from a decision state).
enum class LockInput { kAcquire, kRelease, kTimer, kAnswer, kDecision };

// `Derived` supplies:
//   static absl::Span<const Row> Rows();       its table
//   static constexpr int kStateCount, kEventCount;  the enums' sizes
//   static LockState Public(State);            what its driver sees
//   static const char* StateName(State);
//   static const char* EventName(Event);
//   static LockInput InputOf(Event);           which input an event comes from
//   static bool IsDecision(State);
//   void Observe(const SqlResponse&);           records what an answer shows (once;
//                                               answer_ already says which kind it is)
//   Event Classify(LockInput, const SqlResponse*, const Inputs&) const;
//   Event Decide(const Inputs&) const;          the event a decision state takes
// and the effects its rows name, each `void (const SqlResponse*, const Inputs&)`.
template <typename Derived, typename StateT, typename EventT>
class TableDrivenLock : public LockMachine {
 public:
  using State = StateT;
  using Event = EventT;
  using Effect = void (Derived::*)(const SqlResponse*, const Inputs&);
  struct Row {
    State from;
    Event event;
    State to;
    Effect effect;  // null: nothing to do
  };

  LockOutput Acquire(const Inputs& in) final { return Feed(LockInput::kAcquire, "acquire", nullptr, in); }
  LockOutput Release(const Inputs& in) final { return Feed(LockInput::kRelease, "release", nullptr, in); }
  LockOutput OnTimer(const Inputs& in) final { return Feed(LockInput::kTimer, "timer", nullptr, in); }
  LockOutput OnResponse(const SqlResponse& r, const Inputs& in) final {
    if (r.transport_ok) no_answer_.Answered();
    answer_ = AnswerOf(r);
    if (!Takes(LockInput::kAnswer)) {
      Refuse(LockAnswerName(answer_));
      return TakeOutput();
    }
    self().Observe(r);
    Run(self().Classify(LockInput::kAnswer, &r, in), &r, in);
    return TakeOutput();
  }
  LockState state() const final { return Derived::Public(state_); }

  // The row for (from, event), or null.
  static const Row* Find(State from, Event event) {
    return index().rows[static_cast<int>(from) * Derived::kEventCount + static_cast<int>(event)];
  }
  // `from` has a row for an event of this input.
  static bool Takes(State from, LockInput input) {
    return index().takes[static_cast<int>(from)][static_cast<int>(input)];
  }

 protected:
  TableDrivenLock(const Statements& statements, std::string state_id, LockOptions options,
                  LockMachineOptions machine_options)
      : LockMachine(statements, std::move(state_id), options, machine_options) {}

  State state_{};  // the first enumerator: each machine starts idle

 private:
  // The table indexed by (state, event), built once from Rows() (the first
  // of two rows for one pair would win; lock_table_test shows there are none).
  struct Index {
    std::vector<const Row*> rows;
    std::vector<std::array<bool, 5>> takes;
  };
  static const Index& index() {
    static const Index built = [] {
      Index idx;
      idx.rows.assign(Derived::kStateCount * Derived::kEventCount, nullptr);
      idx.takes.assign(Derived::kStateCount, std::array<bool, 5>{});
      for (const Row& row : Derived::Rows()) {
        const Row*& slot = idx.rows[static_cast<int>(row.from) * Derived::kEventCount + static_cast<int>(row.event)];
        if (slot == nullptr) slot = &row;
        idx.takes[static_cast<int>(row.from)][static_cast<int>(Derived::InputOf(row.event))] = true;
      }
      return idx;
    }();
    return built;
  }

  Derived& self() { return static_cast<Derived&>(*this); }
  bool Takes(LockInput input) const { return Takes(state_, input); }

  LockOutput Feed(LockInput input, const char* name, const SqlResponse* r, const Inputs& in) {
    if (!Takes(input)) {
      Refuse(name);
    } else {
      Run(self().Classify(input, r, in), r, in);
    }
    return TakeOutput();
  }

  // One event through the table, then every decision state it leads to.
  // The effects on the way make the input's one output: at most one next
  // step (a request or a wait) and one outcome.
  void Run(Event e, const SqlResponse* r, const Inputs& in) {
    for (;;) {
      const Row* row = Find(state_, e);
      if (row == nullptr) {
        // The machine's own classifier chose an event its table has no row
        // for: a bug here, never the peer's doing. Stop acting under the lock.
        EndWith(absl::InternalError(absl::StrCat("lock machine: event \"", Derived::EventName(e),
                                                 "\" in state \"", Derived::StateName(state_),
                                                 "\" has no row in its table")));
        return;
      }
      state_ = row->to;
      if (row->effect != nullptr) (self().*(row->effect))(r, in);
      if (two_steps_) {
        // Two effects of one input each chose what to do next: a bug in
        // the table, never the peer's doing.
        two_steps_ = false;
        EndWith(absl::InternalError(absl::StrCat("lock machine: two next steps in one input, the second in state \"",
                                                 Derived::StateName(state_), "\"")));
        return;
      }
      if (!Derived::IsDecision(state_)) return;
      e = self().Decide(in);
    }
  }

  // An input the state does not take: the driver's bug.
  void Refuse(const char* input) {
    EndWith(absl::FailedPreconditionError(
        absl::StrCat("lock misuse: event \"", input, "\" in state \"", LockStateName(state()), "\"")));
  }

  // Ends the machine with `s`; nothing more is sent.
  void EndWith(absl::Status s) {
    out_.next = LockOutput::Next::kNone;
    if (Holding()) {
      EmitLost(std::move(s));
      state_ = Derived::kLostState;
    } else {
      EmitFailed(std::move(s));
      state_ = Derived::kFailedState;
    }
  }
};

}  // namespace chstate

#endif  // CHSTATE_CORE_LOCK_TABLE_H_
