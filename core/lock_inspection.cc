// Reading a lock inspection (lock_common.h): the lock table's rows
// (ParseLockInspection, for the table lock) and the cluster claims of an id
// (ParseClaimInspection, for the claims lock), each parsed once, as its
// answer arrives, into the LockInspection the machine decides on.
#include "core/lock_common.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/defaults.h"
#include "core/response.h"

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
  struct Claim {
    std::string id;
    int64_t newest = 0, stale_s = 0;
    bool live = false;
  };
  LockInspection out;
  std::vector<Claim> others;
  bool ours_visible = false, ours_ended = false, taken_over = false;
  // A claim another claim took over (named in its `over`) was judged stale
  // by the taker, under a window no shorter than its own: its lease is over,
  // whoever reads it now.
  std::set<std::string> taken;
  for (const Row& row : *rows) {
    if (row.size() == 7 && row[5]) {
      for (absl::string_view id : absl::StrSplit(*row[5], ',', absl::SkipEmpty())) taken.emplace(id);
    }
  }
  for (const Row& row : *rows) {
    int64_t claims = 0, ends = 0, newest = 0, row_stale = 0, now = 0;
    if (row.size() != 7 || !row[0] || !row[1] || !row[2] || !row[3] || !row[4] || !row[5] || !row[6] ||
        !absl::SimpleAtoi(*row[1], &claims) || !absl::SimpleAtoi(*row[2], &ends) ||
        !absl::SimpleAtoi(*row[3], &newest) || !absl::SimpleAtoi(*row[4], &row_stale) ||
        !absl::SimpleAtoi(*row[6], &now)) {
      return absl::DataLossError("unexpected answer inspecting the lock's claims");
    }
    out.now_s = std::max(out.now_s, now);
    for (absl::string_view taken : absl::StrSplit(*row[5], ',', absl::SkipEmpty())) {
      if (!ours.empty() && taken == ours) taken_over = true;
    }
    if (*row[0] == ours) {
      ours_visible = claims > 0;
      ours_ended = ends > 0;
      continue;
    }
    // Prunable: its holder's lease is over by its own window (the end row is
    // written within the lease; a taker judged it stale; or it is), or it
    // is rows of a claim that never showed, long ago. A claim judged live
    // by a reader with a longer window is no less over.
    const bool judged_over = ends > 0 || taken.count(*row[0]) || now - newest > row_stale + kClaimPruneSlackS;
    if (claims > 0 ? judged_over : now - newest > kClaimOrphanS) out.dead.push_back(*row[0]);
    // An earlier claim of this very acquisition (ended, its end row maybe not
    // yet visible): never another process's.
    if (!own_prefix.empty() && absl::StartsWith(*row[0], own_prefix)) continue;
    if (claims == 0 || ends > 0 || taken.count(*row[0])) continue;  // ended, taken over, or not visible yet
    // A claim is judged by the larger of the two windows, as a held table is.
    const int64_t window_s = std::max(stale_s, row_stale);
    others.push_back(Claim{*row[0], newest, row_stale, (now - newest) <= window_s});
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

}  // namespace chstate
