// Administration: ping, init (schema and old tombstones), listing and
// force-unlocking locks, and clearing every state: one Op each.
#include "core/store.h"

#include <map>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/lock_machine.h"
#include "core/quoting.h"
#include "core/response.h"
#include "core/store_steps.h"

namespace chstate {

namespace {

HeldLockInfo LockInfo(const LockInspection& insp, std::string table, std::optional<std::string> state_id) {
  HeldLockInfo info;
  info.state_id = std::move(state_id);
  info.table = std::move(table);
  info.holder = insp.holder;
  info.held_s = insp.now_s - insp.created_s;
  info.renewed_s = insp.age_s;
  info.validity_s = insp.stale_s;
  info.stale = insp.stale_s > 0 && insp.age_s >= insp.stale_s;
  return info;
}

// ping: the server's version, always asked.
struct PingSteps {
  StoreSteps& s;
  Next Connect(const Reply&) { return Next::Call(part::Connect(s, /*force=*/true)); }
  Next Done(const Reply&) { return Next::Done(s.Base()); }
  std::string Where(size_t) const { return "ping"; }
};

// A count as an operation's result.
Result Counted(const StoreSteps& s, int64_t count) {
  Result out = s.Base();
  out.count = count;
  return out;
}

// Old lock tombstones, dropped one after another (a step each).
struct DropSteps {
  StoreSteps& s;
  std::vector<SqlRequest> drops;
  size_t next = 0;
  Next Drop(const Reply&) { return Next::Call(s.SqlPart(drops[next++], "removing an old lock tombstone")); }
  std::string Where(size_t) const { return "removing old lock tombstones"; }
};

// init (and compact): the schema; with history, versions past their days
// and beyond the count kept removed (18.x has no TTL: retention is applied
// here; modern tables also have one); then tombstones of taken-over locks
// dropped once older than twice the stale window, when no taker can still
// be acting on what it saw.
struct InitSteps {
  StoreSteps& s;
  const StoreOptions& o;
  int64_t dropped = 0;
  Next Connect(const Reply&) { return Next::Call(part::Connect(s)); }
  Next Schema(const Reply&) { return Next::Call(part::EnsureSchema(s)); }
  Next Expire(const Reply&) {
    if (o.history_days <= 0) return Next::GoOn();
    return Next::Call(s.SqlPart(s.st().ExpireHistory(o.history_days), "removing old state history"));
  }
  Next Trim(const Reply&) {
    if (o.history_days <= 0 || o.history_versions <= 0) return Next::GoOn();
    return Next::Call(s.SqlPart(s.st().TrimHistory(o.history_versions), "removing state versions beyond the count kept"));
  }
  Next ListTombstones(const Reply&) {
    return Next::Send(s.st().ListOldTombstones(2 * ((o.lock.stale_ms + 999) / 1000)));
  }
  Next DropTombstones(const Reply& r) {
    absl::StatusOr<Rows> rows = s.AnswerRows(r, "listing old lock tombstones", 2);
    if (!rows.ok()) return Next::Fail(rows.status());
    std::vector<SqlRequest> drops;
    for (const Row& row : *rows) drops.push_back(s.st().DropTable(row[0].value_or("")));
    dropped = static_cast<int64_t>(drops.size());
    return Next::Call(Steps<DropSteps>(std::vector<Next (DropSteps::*)(const Reply&)>(drops.size(), &DropSteps::Drop), s,
                                       std::move(drops)));
  }
  Next Done(const Reply&) { return Next::Done(Counted(s, dropped)); }
  std::string Where(size_t step) const { return step == 4 ? "listing old lock tombstones" : "init"; }
};

// locks: every lock held now. Lock tables are named by a hash of their id,
// so ids come from the state table; a lock can exist before any state or
// state table does, so the lock tables (cluster mode: the claims not ended)
// are listed too.
class LocksOp final : public StorePart {
 public:
  LocksOp(StoreSteps& s, std::optional<std::string> glob) : StorePart(s), glob_(std::move(glob)) {}
  std::string Where() const override { return "locks"; }

  Next Resume(const Reply& r) override {
    switch (stage_) {
      case Stage::kStart:
        stage_ = Stage::kConnecting;
        return Next::Call(part::Connect(s_));
      case Stage::kConnecting:
        stage_ = Stage::kListingIds;
        return Next::Send(s_.st().ListStateIds(glob_));
      case Stage::kListingIds: {
        absl::StatusOr<Rows> ids = s_.AnswerRows(r, "listing state ids", 2);
        if (!ids.ok() && ids.status().code() != absl::StatusCode::kNotFound) return Next::Fail(ids.status());
        if (ids.ok()) {  // else no state table yet
          for (const Row& row : *ids) names_[s_.st().LockTableName(row[0].value_or(""))] = row[0].value_or("");
        }
        if (s_.st().cluster().enabled()) {
          stage_ = Stage::kListingClaims;
          return Next::Send(s_.st().ListClaims());
        }
        stage_ = Stage::kListingTables;
        return Next::Send(s_.st().ListLockTables());
      }
      case Stage::kListingClaims:
        return Claims(r);
      case Stage::kListingTables: {
        absl::StatusOr<Rows> rows = s_.AnswerRows(r, "listing lock tables", 2);
        if (!rows.ok()) return Next::Fail(rows.status());
        for (const Row& row : *rows) {
          const std::string table = row[0].value_or("");
          auto it = names_.find(table);
          if (it != names_.end()) {
            tables_.emplace_back(table, it->second);
          } else if (!glob_) {
            tables_.emplace_back(table, std::nullopt);
          }
        }
        stage_ = Stage::kInspecting;
        return InspectNext();
      }
      case Stage::kInspecting: {
        absl::StatusOr<std::string> body = s_.Answer(r, "inspecting a lock");
        // Released between the listing and the look: not held.
        if (!body.ok() && body.status().code() != absl::StatusCode::kNotFound) return Next::Fail(body.status());
        if (body.ok()) {
          absl::StatusOr<LockInspection> insp = ParseLockInspection(*body);
          if (!insp.ok()) return Next::Fail(insp.status());
          const auto& [table, id] = tables_[next_];
          if (insp->exists) found_.push_back(LockInfo(*insp, table, id));
        }
        ++next_;
        return InspectNext();
      }
    }
    return Next::Fail(absl::InternalError("locks: no such stage"));
  }

 private:
  Next InspectNext() {
    if (next_ < tables_.size()) return Next::Send(s_.st().InspectLockTable(tables_[next_].first));
    Result r = s_.Base();
    r.locks = std::move(found_);
    return Next::Done(std::move(r));
  }

  // Cluster mode: the claims not ended, one HeldLockInfo each.
  Next Claims(const Reply& r) {
    absl::StatusOr<Rows> rows = s_.AnswerRows(r, "listing lock claims", 8);
    if (!rows.ok()) {
      if (rows.status().code() != absl::StatusCode::kNotFound) return Next::Fail(rows.status());
      Result out = s_.Base();  // no claims table yet: no locks
      out.locks = std::vector<HeldLockInfo>{};
      return Next::Done(std::move(out));
    }
    // A claim another claim took over is gone, ended or not.
    std::set<std::pair<std::string, std::string>> taken;
    for (const Row& row : *rows) {
      for (absl::string_view id : absl::StrSplit(row[7].value_or(""), ',', absl::SkipEmpty())) {
        taken.emplace(row[0].value_or(""), std::string(id));
      }
    }
    std::vector<HeldLockInfo> found;
    for (const Row& row : *rows) {
      if (row[6].value_or("0") != "0" || taken.count({row[0].value_or(""), row[1].value_or("")})) continue;
      int64_t claimed = 0, newest = 0, stale_s = 0, now = 0;
      if (!absl::SimpleAtoi(row[2].value_or(""), &claimed) || !absl::SimpleAtoi(row[3].value_or(""), &newest) ||
          !absl::SimpleAtoi(row[4].value_or(""), &stale_s) || !absl::SimpleAtoi(row[5].value_or(""), &now)) {
        return Next::Fail(absl::DataLossError("unexpected answer listing lock claims"));
      }
      HeldLockInfo info;
      info.table = row[0].value_or("");
      auto it = names_.find(info.table);
      if (it != names_.end()) {
        info.state_id = it->second;
      } else if (glob_) {
        continue;
      }
      info.holder = row[1].value_or("");
      info.held_s = now - claimed;
      info.renewed_s = now - newest;
      info.validity_s = stale_s;
      info.stale = stale_s > 0 && info.renewed_s > stale_s;
      found.push_back(std::move(info));
    }
    Result out = s_.Base();
    out.locks = std::move(found);
    return Next::Done(std::move(out));
  }

  // What the op waits for; Resume goes on from there.
  enum class Stage { kStart, kConnecting, kListingIds, kListingClaims, kListingTables, kInspecting };
  Stage stage_ = Stage::kStart;
  std::optional<std::string> glob_;
  std::map<std::string, std::string> names_;  // lock table -> state id
  std::vector<std::pair<std::string, std::optional<std::string>>> tables_;
  size_t next_ = 0;
  std::vector<HeldLockInfo> found_;
};

// unlock --force: removes the id's lock whoever holds it. One server: the
// lock table is moved to its tombstone as a takeover does. Cluster mode:
// every claim not ended (the holder's and any racer's) is ended.
class ForceUnlockOp final : public StorePart {
 public:
  ForceUnlockOp(StoreSteps& s, std::string id) : StorePart(s), id_(std::move(id)) {}
  std::string Where() const override { return absl::StrCat("unlock \"", PrintableId(id_), "\""); }

  Next Resume(const Reply& r) override {
    switch (stage_) {
      case Stage::kStart:
        stage_ = Stage::kConnecting;
        return Next::Call(part::Connect(s_));
      case Stage::kConnecting:
        stage_ = Stage::kInspecting;
        if (!s_.st().cluster().enabled()) return Next::Send(s_.st().InspectLock(id_));
        // Every claim not ended, as enough replicas show them together.
        inspect_ = s_.st().InspectClaims(id_);
        return Next::Call(part::ReadClaims(s_, inspect_, &claims_read_));
      case Stage::kInspecting: {
        Reply read = r;
        if (r.kind == Reply::Kind::kPart) {
          read.answer = &claims_read_;
          read.sent = &inspect_;
        }
        absl::StatusOr<std::string> body = s_.Answer(read, "inspecting the lock");
        if (!body.ok()) {
          if (body.status().code() != absl::StatusCode::kNotFound) return Next::Fail(body.status());
          return NotLocked();
        }
        const bool claims = s_.st().cluster().enabled();
        absl::StatusOr<LockInspection> insp = claims ? ParseClaimInspection(*body, "", 0) : ParseLockInspection(*body);
        if (!insp.ok()) return Next::Fail(insp.status());
        if (!insp->exists) return NotLocked();
        info_ = LockInfo(*insp, s_.st().LockTableName(id_), id_);
        if (!claims) {
          stage_ = Stage::kEntombing;
          return Next::Send(s_.st().EntombLock(id_, LockInstance(*insp)));
        }
        info_.held_s = 0;  // claims carry no creation time here
        claims_ = absl::StrSplit(insp->over, ',', absl::SkipEmpty());
        stage_ = Stage::kEndingClaims;
        return EndNextClaim();
      }
      case Stage::kEntombing: {
        absl::StatusOr<std::string> done = s_.Answer(r, "removing the lock");
        if (!done.ok()) {
          // 60: released meanwhile; 57: this instance was taken over already.
          const absl::StatusCode code = done.status().code();
          if (code == absl::StatusCode::kNotFound || code == absl::StatusCode::kAlreadyExists) {
            return Next::Fail(absl::AbortedError(
                absl::StrCat("the lock on state id \"", PrintableId(id_),
                             "\" changed hands while it was being removed; look again with `chstate locks`")));
          }
          return Next::Fail(done.status());
        }
        return Removed();
      }
      case Stage::kEndingClaims:
        return EndNextClaim();
    }
    return Next::Fail(absl::InternalError("unlock: no such stage"));
  }

 private:
  Next NotLocked() const {
    return Next::Fail(absl::NotFoundError(absl::StrCat("state id \"", PrintableId(id_), "\" is not locked")));
  }
  Next EndNextClaim() {
    if (ended_ == claims_.size()) return Removed();
    const std::string& claim = claims_[ended_++];
    return Next::Call(part::QuorumWrite(s_, s_.st().EndClaim(id_, claim), "removing the lock",
                                        s_.inputs().now_ms + s_.st().cluster().quorum_busy_ms, 5));
  }
  Next Removed() {
    Result out = s_.Base();
    out.locks = std::vector<HeldLockInfo>{info_};
    return Next::Done(std::move(out));
  }

  // What the op waits for; Resume goes on from there.
  enum class Stage { kStart, kConnecting, kInspecting, kEntombing, kEndingClaims };
  Stage stage_ = Stage::kStart;
  std::string id_;
  HeldLockInfo info_;
  std::vector<std::string> claims_;
  size_t ended_ = 0;
  SqlRequest inspect_;         // cluster mode: the claims read ...
  SqlResponse claims_read_;    // ... and its answers, joined (part::ReadClaims)
};

// clear --all: every state removed (no lock), counted first.
struct ClearAllSteps {
  StoreSteps& s;
  int64_t count = 0;
  Next Connect(const Reply&) { return Next::Call(part::Connect(s)); }
  Next Count(const Reply&) { return Next::Send(s.st().CountStates()); }
  Next Clear(const Reply& r) {
    absl::StatusOr<Rows> rows = s.AnswerRows(r, "counting states", 2);
    if (!rows.ok()) {
      if (rows.status().code() == absl::StatusCode::kNotFound) return Next::Done(s.Base());
      return Next::Fail(rows.status());
    }
    if (rows->empty() || !(*rows)[0][0] || !absl::SimpleAtoi(*(*rows)[0][0], &count)) {
      return Next::Fail(absl::DataLossError("unexpected answer counting states"));
    }
    return Next::Call(part::QuorumWrite(s, s.st().ClearStates(), "clearing all states",
                                        s.inputs().now_ms + s.st().cluster().quorum_busy_ms, 5));
  }
  Next Done(const Reply&) { return Next::Done(Counted(s, count)); }
  std::string Where(size_t) const { return "clear all"; }
};

}  // namespace

std::unique_ptr<Task> Store::Ping() {
  return MakeOpTask(this, [&](StoreSteps& s) { return Steps<PingSteps>({&PingSteps::Connect, &PingSteps::Done}, s); });
}

std::unique_ptr<Task> Store::Init() {
  return MakeOpTask(this, [&](StoreSteps& s) {
    using I = InitSteps;
    return Steps<I>({&I::Connect, &I::Schema, &I::Expire, &I::Trim, &I::ListTombstones, &I::DropTombstones, &I::Done}, s, s.options());
  });
}

std::unique_ptr<Task> Store::Locks(std::optional<std::string> glob) {
  return MakeOpTask(this, [&](StoreSteps& s) { return std::make_unique<LocksOp>(s, glob); });
}

std::unique_ptr<Task> Store::ForceUnlock(std::string state_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  return MakeOpTask(this, [&](StoreSteps& s) { return std::make_unique<ForceUnlockOp>(s, state_id); });
}

std::unique_ptr<Task> Store::ClearAll() {
  return MakeOpTask(this, [&](StoreSteps& s) {
    using C = ClearAllSteps;
    return Steps<C>({&C::Connect, &C::Count, &C::Clear, &C::Done}, s);
  });
}

}  // namespace chstate
