// Reading a lock inspection (lock_common.h): the lock table's rows
// (ParseLockInspection, for the table lock) and the cluster claims of an id
// (ParseClaimInspection, for the claims lock), each parsed once, as its
// answer arrives, into the LockInspection the machine decides on.
#include "core/lock_common.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/defaults.h"
#include "core/response.h"
#include "core/statements.h"

namespace chstate {

std::string LockInstance(const LockInspection& inspection) {
  return inspection.holder.empty() ? absl::StrCat("empty@", inspection.table_created_s)
                                   : absl::StrCat("holder:", inspection.holder);
}

absl::StatusOr<LockInspection> ParseLockInspection(const std::string& body) {
  absl::StatusOr<Rows> rows = ParseTabSeparated(body, 5);
  if (!rows.ok()) return rows.status();
  LockInspection out;
  int64_t now = 0, table_time = 0, newest = -1, created = -1;
  bool have_table_row = false;
  struct Parsed {
    std::string id;
    int64_t seq, at, stale_s;
  };
  std::vector<Parsed> lock_rows;
  for (const Row& row : *rows) {
    int64_t seq = 0, at = 0, row_now = 0, stale_s = 0;
    if (!row[0] || !row[1] || !row[2] || !row[3] || !row[4] || !absl::SimpleAtoi(*row[1], &seq) ||
        !absl::SimpleAtoi(*row[2], &at) || !absl::SimpleAtoi(*row[3], &row_now) ||
        !absl::SimpleAtoi(*row[4], &stale_s)) {
      return absl::DataLossError("unexpected answer inspecting a lock");
    }
    now = std::max(now, row_now);
    if (seq == 255) {
      have_table_row = true;
      table_time = at;
    } else {
      lock_rows.push_back({*row[0], seq, at, stale_s});
    }
  }
  if (!have_table_row) return out;  // no such table: no lock
  out.exists = true;
  for (const Parsed& p : lock_rows) {
    if (p.seq == 0) {
      out.holder = p.id;
      created = p.at;
      out.stale_s = p.stale_s;
    }
  }
  if (created >= 0) {
    for (const Parsed& p : lock_rows) {
      if (p.id == out.holder) newest = std::max(newest, p.at);
    }
  } else {
    newest = table_time;  // creation row not visible yet
  }
  out.age_s = now - newest;
  out.created_s = created >= 0 ? created : table_time;
  out.table_created_s = table_time;
  out.now_s = now;
  return out;
}

absl::StatusOr<LockInspection> ParseClaimInspection(const std::string& body, const std::string& ours,
                                                    int64_t stale_s, const std::string& own_prefix) {
  absl::StatusOr<Rows> rows = ParseTabSeparated(body, 7);
  if (!rows.ok()) return rows.status();
  // A claim as the replicas that answered show it together: its rows may
  // be on one of them and its end row on another.
  struct Seen {
    int64_t claims = 0, ends = 0, newest = 0, stale_s = 0, now = 0;
    std::string over;
  };
  std::map<std::string, Seen> seen;
  LockInspection out;
  for (const Row& row : *rows) {
    int64_t claims = 0, ends = 0, newest = 0, row_stale = 0, now = 0;
    if (row.size() != 7 || !row[0] || !row[1] || !row[2] || !row[3] || !row[4] || !row[5] || !row[6] ||
        !absl::SimpleAtoi(*row[1], &claims) || !absl::SimpleAtoi(*row[2], &ends) ||
        !absl::SimpleAtoi(*row[3], &newest) || !absl::SimpleAtoi(*row[4], &row_stale) ||
        !absl::SimpleAtoi(*row[6], &now)) {
      return absl::DataLossError("unexpected answer inspecting the lock's claims");
    }
    out.now_s = std::max(out.now_s, now);
    if (absl::StartsWith(*row[0], kClaimsReplicaRow)) continue;
    Seen& c = seen[*row[0]];
    c.claims = std::max(c.claims, claims);
    c.ends = std::max(c.ends, ends);
    c.newest = std::max(c.newest, newest);
    c.stale_s = std::max(c.stale_s, row_stale);
    c.now = std::max(c.now, now);
    if (c.over.empty()) c.over = *row[5];
  }
  struct Claim {
    std::string id;
    int64_t newest = 0, stale_s = 0;
    bool live = false;
  };
  std::vector<Claim> others;
  bool ours_visible = false, ours_ended = false, taken_over = false;
  // A claim another claim took over (named in its `over`) was judged stale
  // by the taker, under a window no shorter than its own: its lease is over,
  // whoever reads it now.
  std::set<std::string> taken;
  for (const auto& [id, c] : seen) {
    for (absl::string_view t : absl::StrSplit(c.over, ',', absl::SkipEmpty())) {
      taken.emplace(t);
      if (!ours.empty() && t == ours) taken_over = true;
    }
  }
  for (const auto& [id, c] : seen) {
    if (id == ours) {
      ours_visible = c.claims > 0;
      ours_ended = c.ends > 0;
      continue;
    }
    // Prunable: its holder's lease is over by its own window (the end row is
    // written within the lease; a taker judged it stale; or it is), or it
    // is rows of a claim that never showed, long ago. A claim judged live
    // by a reader with a longer window is no less over.
    const bool judged_over = c.ends > 0 || taken.count(id) || c.now - c.newest > c.stale_s + kClaimPruneSlackS;
    if (c.claims > 0 ? judged_over : c.now - c.newest > kClaimOrphanS) out.dead.push_back(id);
    // An earlier claim of this very acquisition (ended, its end row maybe not
    // yet visible): never another process's.
    if (!own_prefix.empty() && absl::StartsWith(id, own_prefix)) continue;
    if (c.claims == 0 || c.ends > 0 || taken.count(id)) continue;  // ended, taken over, or not visible yet
    // A claim is judged by the larger of the two windows, as a held table is.
    const int64_t window_s = std::max(stale_s, c.stale_s);
    others.push_back(Claim{id, c.newest, c.stale_s, (c.now - c.newest) <= window_s});
  }
  out.ours_held = ours_visible && !ours_ended && !taken_over;
  std::vector<std::string> over;
  const Claim* pick = nullptr;
  for (const Claim& c : others) {
    over.push_back(c.id);
    const bool better = pick == nullptr || (c.live && !pick->live) ||
                        (c.live == pick->live && c.newest > pick->newest);
    if (better) pick = &c;
  }
  out.over = absl::StrJoin(over, ",");
  if (pick != nullptr && pick->live) {
    out.exists = true;
    out.holder = pick->id;
    out.age_s = out.now_s - pick->newest;
    out.stale_s = pick->stale_s;
  } else if (out.ours_held) {
    out.exists = true;
    out.holder = ours;
    out.stale_s = stale_s;
  } else if (pick != nullptr) {
    out.exists = true;
    out.holder = pick->id;
    out.age_s = out.now_s - pick->newest;
    out.stale_s = pick->stale_s;
  }
  out.created_s = out.table_created_s = 0;
  return out;
}

std::optional<ClaimsReplica> ClaimsReadReplica(const std::string& body) {
  absl::StatusOr<Rows> rows = ParseTabSeparated(body, 7);
  if (!rows.ok()) return std::nullopt;
  std::optional<ClaimsReplica> out;
  for (const Row& row : *rows) {
    int64_t replicas = 0;
    if (row.size() == 7 && row[0] && row[1] && row[5] && *row[0] == kClaimsReplicaRow &&
        absl::SimpleAtoi(*row[1], &replicas)) {
      out = ClaimsReplica{*row[5], replicas};
    }
  }
  return out;
}

int64_t ClaimsReplicasToRead(int64_t replicas, int quorum) {
  // A confirmed claim is on `quorum` replicas: any replicas - quorum + 1 of
  // them include one of those.
  return std::max<int64_t>(1, replicas - quorum + 1);
}

}  // namespace chstate
