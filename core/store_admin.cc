// Administration: ping, init (schema and old tombstones), listing and
// force-unlocking locks, and clearing every state.
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

std::unique_ptr<Task> Store::Ping() {
  return MakeTask(this, [](StoreSteps& s) {
    return s.Connected([&s] { return Step::Done(s.Base()); }, StoreSteps::Failed, /*force=*/true);
  });
}

namespace {

// Drops tombstones of taken-over locks once they are older than twice the
// stale window: by then no taker can still be acting on what it saw.
Step DropTombstones(StoreSteps& s, std::vector<std::string> names, size_t next, int64_t* dropped) {
  if (next >= names.size()) {
    Result r = s.Base();
    r.count = *dropped;
    return Step::Done(std::move(r));
  }
  SqlRequest drop = s.st().DropTable(names[next]);
  return s.Sql(
      std::move(drop), "removing an old lock tombstone",
      [&s, names, next, dropped](const std::string&) {
        ++*dropped;
        return DropTombstones(s, names, next + 1, dropped);
      },
      StoreSteps::Failed);
}

}  // namespace

std::unique_ptr<Task> Store::Init() {
  return MakeTask(this, [this](StoreSteps& s) {
    return s.Connected(
        [this, &s] {
          return s.EnsureSchema(
              [this, &s] {
                auto tombstones = [this, &s] {
                  int64_t older_than_s = 2 * ((options_.lock.stale_ms + 999) / 1000);
                  return s.Query(
                      s.st().ListOldTombstones(older_than_s), "listing old lock tombstones", 2,
                      [&s](const Rows& rows) {
                        std::vector<std::string> names;
                        for (const Row& row : rows) names.push_back(row[0].value_or(""));
                        auto dropped = std::make_shared<int64_t>(0);
                        // The counter lives as long as the steps that use it.
                        return DropTombstones(s, names, 0, s.Keep(dropped));
                      },
                      StoreSteps::Failed);
                };
                if (options_.history_days <= 0) return tombstones();
                auto trim = [this, &s, tombstones] {
                  if (options_.history_versions <= 0) return tombstones();
                  return s.Sql(
                      s.st().TrimHistory(options_.history_versions), "removing state versions beyond the count kept",
                      [tombstones](const std::string&) { return tombstones(); }, StoreSteps::Failed);
                };
                // 18.x has no TTL: retention is applied here (modern tables also have one).
                return s.Sql(
                    s.st().ExpireHistory(options_.history_days), "removing old state history",
                    [trim](const std::string&) { return trim(); }, StoreSteps::Failed);
              },
              StoreSteps::Failed);
        },
        StoreSteps::Failed);
  });
}

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

// Inspects the lock tables from `next` on, one request each, collecting the
// ones that still exist.
Step InspectLocks(StoreSteps& s, std::shared_ptr<std::vector<std::pair<std::string, std::optional<std::string>>>> tables,
                  size_t next, std::shared_ptr<std::vector<HeldLockInfo>> found) {
  if (next >= tables->size()) {
    Result r = s.Base();
    r.locks = *found;
    return Step::Done(std::move(r));
  }
  const auto& [table, id] = (*tables)[next];
  return s.Sql(
      s.st().InspectLockTable(table), "inspecting a lock",
      [&s, tables, next, found](const std::string& body) {
        absl::StatusOr<LockInspection> insp = ParseLockInspection(body);
        if (!insp.ok()) return Step::Fail(insp.status());
        if (insp->exists) found->push_back(LockInfo(*insp, (*tables)[next].first, (*tables)[next].second));
        return InspectLocks(s, tables, next + 1, found);
      },
      [&s, tables, next, found](absl::Status st) {
        // Released between the listing and the look: not held.
        if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
        return InspectLocks(s, tables, next + 1, found);
      });
}

// Cluster mode: the claims not ended, one HeldLockInfo each (`names` maps
// lock names to state ids).
Step ListClaimLocks(StoreSteps& s, std::shared_ptr<std::map<std::string, std::string>> names, bool all) {
  return s.Query(
      s.st().ListClaims(), "listing lock claims", 8,
      [names, all, &s](const Rows& rows) {
        // A claim another claim took over is gone, ended or not.
        std::set<std::pair<std::string, std::string>> taken;
        for (const Row& row : rows) {
          for (absl::string_view id : absl::StrSplit(row[7].value_or(""), ',', absl::SkipEmpty())) {
            taken.emplace(row[0].value_or(""), std::string(id));
          }
        }
        std::vector<HeldLockInfo> found;
        for (const Row& row : rows) {
          if (row[6].value_or("0") != "0" || taken.count({row[0].value_or(""), row[1].value_or("")})) continue;
          int64_t claimed = 0, newest = 0, stale_s = 0, now = 0;
          if (!absl::SimpleAtoi(row[2].value_or(""), &claimed) || !absl::SimpleAtoi(row[3].value_or(""), &newest) ||
              !absl::SimpleAtoi(row[4].value_or(""), &stale_s) || !absl::SimpleAtoi(row[5].value_or(""), &now)) {
            return Step::Fail(absl::DataLossError("unexpected answer listing lock claims"));
          }
          HeldLockInfo info;
          info.table = row[0].value_or("");
          auto it = names->find(info.table);
          if (it != names->end()) {
            info.state_id = it->second;
          } else if (!all) {
            continue;
          }
          info.holder = row[1].value_or("");
          info.held_s = now - claimed;
          info.renewed_s = now - newest;
          info.validity_s = stale_s;
          info.stale = stale_s > 0 && info.renewed_s > stale_s;
          found.push_back(std::move(info));
        }
        Result r = s.Base();
        r.locks = std::move(found);
        return Step::Done(std::move(r));
      },
      [&s](absl::Status st) {
        if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
        Result r = s.Base();  // no claims table yet: no locks
        r.locks = std::vector<HeldLockInfo>{};
        return Step::Done(std::move(r));
      });
}

// Cluster mode: ends the claims in `ids` from `next` on.
Step EndClaims(StoreSteps& s, const std::string& state_id, std::shared_ptr<std::vector<std::string>> ids, size_t next,
               HeldLockInfo info) {
  if (next >= ids->size()) {
    Result r = s.Base();
    r.locks = std::vector<HeldLockInfo>{info};
    return Step::Done(std::move(r));
  }
  return s.QuorumWrite(
      s.st().EndClaim(state_id, (*ids)[next]), "removing the lock",
      s.inputs().now_ms + s.st().cluster().quorum_busy_ms, 5,
      [&s, state_id, ids, next, info] { return EndClaims(s, state_id, ids, next + 1, info); }, StoreSteps::Failed);
}

}  // namespace

std::unique_ptr<Task> Store::Locks(std::optional<std::string> glob) {
  return MakeTask(this, [glob](StoreSteps& s) {
    return s.Connected(
        [&s, glob] {
          // Lock tables by name, then (a lock can exist before any state or
          // state table does) the tables themselves.
          std::function<Step(std::shared_ptr<std::map<std::string, std::string>>)> with_ids =
              [&s, glob](std::shared_ptr<std::map<std::string, std::string>> names) {
            return s.Query(
                s.st().ListLockTables(), "listing lock tables", 2,
                [&s, glob, names](const Rows& rows) {
                  auto tables = std::make_shared<std::vector<std::pair<std::string, std::optional<std::string>>>>();
                  for (const Row& row : rows) {
                    const std::string table = row[0].value_or("");
                    auto it = names->find(table);
                    if (it != names->end()) {
                      tables->emplace_back(table, it->second);
                    } else if (!glob) {
                      tables->emplace_back(table, std::nullopt);
                    }
                  }
                  return InspectLocks(s, tables, 0, std::make_shared<std::vector<HeldLockInfo>>());
                },
                StoreSteps::Failed);
          };
          if (s.st().cluster().enabled()) {
            // Cluster mode: the claims not ended.
            with_ids = [&s, glob](std::shared_ptr<std::map<std::string, std::string>> names) {
              return ListClaimLocks(s, names, !glob);
            };
          }
          return s.Query(
              s.st().ListStateIds(glob), "listing state ids", 2,
              [&s, with_ids](const Rows& ids) {
                auto names = std::make_shared<std::map<std::string, std::string>>();
                for (const Row& row : ids) (*names)[s.st().LockTableName(row[0].value_or(""))] = row[0].value_or("");
                return with_ids(names);
              },
              [with_ids](absl::Status st) {
                if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
                return with_ids(std::make_shared<std::map<std::string, std::string>>());  // no state table yet
              });
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::ForceUnlock(std::string state_id) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  return MakeTask(this, [state_id](StoreSteps& s) {
    return s.Connected(
        [&s, state_id] {
          auto not_locked = [state_id] {
            return Step::Fail(absl::NotFoundError(
                absl::StrCat("state id \"", PrintableId(state_id), "\" is not locked")));
          };
          if (s.st().cluster().enabled()) {
            // Every claim not ended: the holder's and any racer's.
            return s.Sql(
                s.st().InspectClaims(state_id), "inspecting the lock",
                [&s, state_id, not_locked](const std::string& body) {
                  absl::StatusOr<LockInspection> insp = ParseClaimInspection(body, "", 0);
                  if (!insp.ok()) return Step::Fail(insp.status());
                  if (!insp->exists) return not_locked();
                  HeldLockInfo info = LockInfo(*insp, s.st().LockTableName(state_id), state_id);
                  info.held_s = 0;  // claims carry no creation time here
                  auto ids = std::make_shared<std::vector<std::string>>(absl::StrSplit(insp->over, ',', absl::SkipEmpty()));
                  return EndClaims(s, state_id, ids, 0, info);
                },
                [not_locked](absl::Status st) {
                  if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
                  return not_locked();
                });
          }
          return s.Sql(
              s.st().InspectLock(state_id), "inspecting the lock",
              [&s, state_id, not_locked](const std::string& body) {
                absl::StatusOr<LockInspection> insp = ParseLockInspection(body);
                if (!insp.ok()) return Step::Fail(insp.status());
                if (!insp->exists) return not_locked();
                HeldLockInfo info = LockInfo(*insp, s.st().LockTableName(state_id), state_id);
                return s.Sql(
                    s.st().EntombLock(state_id, LockInstance(*insp)), "removing the lock",
                    [&s, info](const std::string&) {
                      Result r = s.Base();
                      r.locks = std::vector<HeldLockInfo>{info};
                      return Step::Done(std::move(r));
                    },
                    [state_id](absl::Status st) {
                      // 60: released meanwhile; 57: this instance was taken over already.
                      if (st.code() == absl::StatusCode::kNotFound || st.code() == absl::StatusCode::kAlreadyExists) {
                        return Step::Fail(absl::AbortedError(absl::StrCat(
                            "the lock on state id \"", PrintableId(state_id),
                            "\" changed hands while it was being removed; look again with `chstate locks`")));
                      }
                      return Step::Fail(std::move(st));
                    });
              },
              [not_locked](absl::Status st) {
                if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
                return not_locked();
              });
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::ClearAll() {
  return MakeTask(this, [](StoreSteps& s) {
    return s.Connected(
        [&s] {
          return s.Query(
              s.st().CountStates(), "counting states", 2,
              [&s](const Rows& rows) {
                int64_t count = 0;
                if (rows.empty() || !rows[0][0] || !absl::SimpleAtoi(*rows[0][0], &count)) {
                  return Step::Fail(absl::DataLossError("unexpected answer counting states"));
                }
                return s.QuorumWrite(
                    s.st().ClearStates(), "clearing all states",
                    s.inputs().now_ms + s.st().cluster().quorum_busy_ms, 5,
                    [&s, count] {
                      Result r = s.Base();
                      r.count = count;
                      return Step::Done(std::move(r));
                    },
                    StoreSteps::Failed);
              },
              [&s](absl::Status st) {
                if (st.code() == absl::StatusCode::kNotFound) return Step::Done(s.Base());
                return Step::Fail(std::move(st));
              });
        },
        StoreSteps::Failed);
  });
}

}  // namespace chstate
