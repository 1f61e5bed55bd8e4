// Bulk and history operations: listing, export (sampled pages) and import
// (multi-row INSERTs), and the history view's versions and rollback.
#include "core/store.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/quoting.h"
#include "core/response.h"
#include "core/store_steps.h"

namespace chstate {

std::unique_ptr<Task> Store::History(std::string state_id, int64_t limit) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  if (limit < 1) return Invalid(absl::InvalidArgumentError("a history lists at least one version"));
  return MakeTask(this, [state_id, limit](StoreSteps& s) {
    return s.Connected(
        [&s, state_id, limit] {
          auto listed = [&s, state_id](std::vector<StateVersion> versions) {
            return s.ReadState(
                state_id,
                [&s, versions](std::optional<MeltanoState> now) mutable {
                  // 18.x keeps whole seconds: among the newest second's
                  // versions, the one the state table holds is the newest.
                  for (size_t i = 0; now && i < versions.size() && versions[i].unix_ms == versions[0].unix_ms; ++i) {
                    if (versions[i].state.partial == now->partial && versions[i].state.completed == now->completed) {
                      versions[i].current = true;
                      std::rotate(versions.begin(), versions.begin() + i, versions.begin() + i + 1);
                      break;
                    }
                  }
                  Result r = s.Base();
                  r.versions = std::move(versions);
                  return Step::Done(std::move(r));
                },
                StoreSteps::Failed);
          };
          return s.Query(
              s.st().ListHistory(state_id, limit), "reading the state history", 5,
              [state_id, listed](const Rows& rows) {
                absl::StatusOr<std::vector<StateVersion>> versions = StoreSteps::Versions(state_id, rows);
                if (!versions.ok()) return Step::Fail(versions.status());
                return listed(*std::move(versions));
              },
              [listed](absl::Status st) {
                if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
                return listed({});
              });
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::Rollback(std::string state_id, std::string version) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  int64_t unix_ms = 0;
  const size_t dash = version.find('-');
  const std::string hash8 = dash == std::string::npos ? "" : version.substr(dash + 1);
  if (dash == std::string::npos || !absl::SimpleAtoi(version.substr(0, dash), &unix_ms) || unix_ms < 0 ||
      hash8.size() != 8 || hash8.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return Invalid(absl::InvalidArgumentError(absl::StrCat(
        "\"", PrintableId(version),
        "\" is not a version: versions look like 1796155032000-9f3a2b1c (`chstate history ID` lists them)")));
  }
  return MakeTask(this, [state_id, version, unix_ms, hash8](StoreSteps& s) {
    return s.Connected(
        [&s, state_id, version, unix_ms, hash8] {
          return s.WithLock(state_id, [&s, state_id, version, unix_ms, hash8](StoreSteps::Finish finish) {
            auto missing = [state_id, version] {
              return absl::NotFoundError(absl::StrCat(
                  "state id \"", PrintableId(state_id), "\" has no version ", version,
                  " in its history; `chstate history ID` lists the versions kept"));
            };
            return s.Query(
                s.st().GetHistoryVersion(state_id, unix_ms, hash8), "reading a version from the state history", 5,
                [&s, state_id, finish, missing](const Rows& rows) {
                  absl::StatusOr<std::vector<StateVersion>> found = StoreSteps::Versions(state_id, rows);
                  if (!found.ok()) return finish(found.status());
                  if (found->empty()) return finish(missing());
                  MeltanoState restored = std::move(found->front().state);
                  return s.WriteState(
                      restored,
                      [&s, finish, restored] {
                        Result r = s.Base();
                        r.state = restored;
                        return finish(std::move(r));
                      },
                      finish);
                },
                [finish, missing](absl::Status st) {
                  return finish(st.code() == absl::StatusCode::kNotFound ? missing() : st);
                });
          });
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::List(std::optional<std::string> glob) {
  return MakeTask(this, [glob](StoreSteps& s) {
    return s.Connected(
        [&s, glob] {
          return s.Query(
              s.st().ListStateIds(glob), "listing state ids", 2,
              [&s](const Rows& rows) {
                Result r = s.Base();
                for (const Row& row : rows) r.state_ids.push_back(row[0].value_or(""));
                return Step::Done(std::move(r));
              },
              [&s](absl::Status st) {
                if (st.code() == absl::StatusCode::kNotFound) return Step::Done(s.Base());
                return Step::Fail(std::move(st));
              });
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::ExportPage(std::optional<std::string> glob, std::optional<std::string> after,
                                        int64_t limit) {
  if (limit < 1) return Invalid(absl::InvalidArgumentError("an export page holds at least one state"));
  if (after) {
    if (absl::Status st = ValidateStateId(*after); !st.ok()) return Invalid(st);
  }
  // What continues is looked at when the task starts (see RenewLock).
  return MakeTask(this, [this, glob, after, limit](StoreSteps& s) {
    return s.Connected(
        [this, &s, glob, after, limit] {
          if (export_ && after && export_->after == after && export_->glob == glob) return s.ExportRange(after, limit);
          export_ = ExportCursor{glob, after};
          return s.ExportSample(after, limit);
        },
        StoreSteps::Failed);
  });
}

std::unique_ptr<Task> Store::Import(std::vector<MeltanoState> states) {
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < states.size(); ++i) {
    const std::string& id = states[i].state_id;
    if (absl::Status st = ValidateStateId(id); !st.ok()) {
      return Invalid(absl::InvalidArgumentError(
          absl::StrCat("import entry ", i + 1, " of ", states.size(), ": ", st.message(), "; nothing was written")));
    }
    auto [it, fresh] = seen.emplace(id, i);
    if (!fresh) {
      return Invalid(absl::InvalidArgumentError(absl::StrCat(
          "import entries ", it->second + 1, " and ", i + 1, " have the same state id ",
          "\"", PrintableId(id), "\"; keep one of them (nothing was written)")));
    }
  }
  auto all = std::make_shared<const std::vector<MeltanoState>>(std::move(states));
  return MakeTask(this, [all](StoreSteps& s) {
    return s.Connected([&s, all] { return s.WriteBatches(all, 0, false); }, StoreSteps::Failed);
  });
}

// Rows of ListHistory / GetHistoryVersion as versions.
absl::StatusOr<std::vector<StateVersion>> StoreSteps::Versions(const std::string& id, const Rows& rows) {
  std::vector<StateVersion> out;
  for (const Row& row : rows) {
    StateVersion v;
    if (!row[0] || !absl::SimpleAtoi(*row[0], &v.unix_ms) || !row[1] || !row[2]) {
      return absl::DataLossError(absl::StrCat("ClickHouse sent a malformed history row for state id \"",
                                              PrintableId(id), "\""));
    }
    v.version = absl::StrCat(v.unix_ms, "-", *row[1]);
    // "2026-12-01 20:01:02[.123]" in UTC -> ISO 8601.
    v.updated_at = absl::StrCat(absl::StrReplaceAll(*row[2], {{" ", "T"}}), "Z");
    absl::StatusOr<nlohmann::json> partial = FromColumn(row[3], id, "partial_state");
    if (!partial.ok()) return partial.status();
    absl::StatusOr<nlohmann::json> completed = FromColumn(row[4], id, "completed_state");
    if (!completed.ok()) return completed.status();
    v.state = {id, *std::move(partial), *std::move(completed)};
    out.push_back(std::move(v));
  }
  return out;
}

// After a write of `id`, one time in kHistoryUpkeepEvery (by the fresh
// random bytes of the write's answer): the id's versions beyond
// history_versions or older than history_days are removed. The write is
// done either way; a failure here is left to a later write.
Step StoreSteps::HistoryUpkeep(const std::string& id, Then then) {
  const StoreOptions& o = s_->options_;
  if (o.history_days <= 0 || in_->random.size() < 16 ||
      static_cast<unsigned char>(in_->random[15]) % kHistoryUpkeepEvery != 0) {
    return then();
  }
  return Query(
      st().HistoryOverLimits(id, o.history_versions, o.history_days), "counting the state's versions", 3,
      [this, id, then](const Rows& rows) -> Step {
        const StoreOptions& o = s_->options_;
        int64_t count = 0, expired = 0, cutoff_ms = 0;
        if (rows.empty() || !absl::SimpleAtoi(rows[0][0].value_or(""), &count) ||
            !absl::SimpleAtoi(rows[0][1].value_or(""), &expired) ||
            !absl::SimpleAtoi(rows[0][2].value_or(""), &cutoff_ms)) {
          return then();
        }
        const bool over_count = o.history_versions > 0 && count > o.history_versions && cutoff_ms > 0;
        if (!over_count && expired == 0) return then();
        return Sql(
            st().TrimHistoryOf(id, over_count ? cutoff_ms : 0, o.history_days),
            "removing the state's old versions", [then](const std::string&) { return then(); },
            [then](absl::Status) { return then(); });
      },
      [then](absl::Status) { return then(); });
}

// Import: the states from `from` on, in multi-row INSERTs (see
// Store::Import), creating the schema once if it is missing.
Step StoreSteps::WriteBatches(std::shared_ptr<const std::vector<MeltanoState>> all, size_t from, bool schema_made) {
  const std::vector<MeltanoState>& states = *all;
  if (from >= states.size()) {
    Result r = Base();
    r.count = static_cast<int64_t>(states.size());
    return Step::Done(std::move(r));
  }
  std::vector<Statements::StateRow> rows;
  int64_t bytes = 0;
  size_t next = from;
  for (; next < states.size() && static_cast<int64_t>(rows.size()) < kDefaultImportBatchStates; ++next) {
    const MeltanoState& state = states[next];
    if (absl::Status lease = LeaseCheck(state.state_id); !lease.ok()) return Failed(lease);
    Statements::StateRow row{state.state_id, ToColumn(state.partial), ToColumn(state.completed)};
    // Quoting at most quadruples a byte (\xHH); a row alone is always sent.
    int64_t size = 4 * static_cast<int64_t>(row.state_id.size() + row.partial_json.value_or("").size() +
                                            row.completed_json.value_or("").size()) + 32;
    if (!rows.empty() && bytes + size > kDefaultImportBatchBytes) break;
    bytes += size;
    rows.push_back(std::move(row));
  }
  absl::StatusOr<std::string> token = Token();
  if (!token.ok()) return Failed(token.status());
  SqlRequest req = st().InsertStates(rows, *token);
  for (const Statements::StateRow& row : rows) req = UnderLease(std::move(req), row.state_id);
  return QuorumWrite(
      std::move(req), absl::StrCat("importing states ", from + 1, "-", next, " of ", states.size()),
      in_->now_ms + s_->options_.cluster.quorum_busy_ms, 5,
      [this, all, next] { return WriteBatches(all, next, true); },
      [this, all, from, schema_made](absl::Status st) -> Step {
        if (st.code() == absl::StatusCode::kNotFound && !schema_made) {
          return EnsureSchema([this, all, from] { return WriteBatches(all, from, true); }, Failed);
        }
        return Failed(absl::Status(
            st.code(), absl::StrCat(st.message(), "; the import stopped after ", from, " of ", all->size(),
                                    " states were written (sorted as given). Importing the same states again is "
                                    "safe: each write overwrites the whole state")));
      });
}

// Samples the page boundaries beyond `from` into the store's export
// cursor, then reads the next page.
Step StoreSteps::ExportSample(std::optional<std::string> from, int64_t limit) {
  Store::ExportCursor& c = *s_->export_;
  return Query(
      st().SampleStateIds(c.glob, from, kExportSampleEvery, kExportSampleCount), "sampling state ids to export", 2,
      [this, from, limit](const Rows& rows) {
        Store::ExportCursor& c = *s_->export_;
        c.bounds.clear();
        for (const Row& row : rows) {
          std::string id = row[0].value_or("");
          // Sorted by the server; kept strictly ascending and beyond `from`
          // whatever it sent, so that every range is well formed.
          if ((from && id <= *from) || (!c.bounds.empty() && id <= c.bounds.back())) continue;
          c.bounds.push_back(std::move(id));
        }
        c.sampled_to_end = static_cast<int64_t>(rows.size()) < kExportSampleCount || c.bounds.empty();
        return ExportRange(from, limit);
      },
      [this](absl::Status st) { return ExportFailed(std::move(st)); });
}

// Reads the states after `from` up to the next boundaries (as many ranges
// as make about kDefaultExportPageBytes, at most `limit` states).
Step StoreSteps::ExportRange(std::optional<std::string> from, int64_t limit) {
  Store::ExportCursor& c = *s_->export_;
  if (c.bounds.empty() && !c.sampled_to_end) return ExportSample(from, limit);
  // The first page is one range; later ones as many as the size of the
  // states read so far lets into the byte budget.
  size_t ranges = 1;
  if (c.bytes_per_state > 0) {
    const int64_t states = std::min(limit, kDefaultExportPageBytes / c.bytes_per_state);
    ranges = static_cast<size_t>(std::max<int64_t>(states / kExportSampleEvery, 1));
  }
  std::optional<std::string> upto;
  if (c.bounds.size() >= ranges) {
    upto = c.bounds[ranges - 1];
  } else if (!c.bounds.empty() && !c.sampled_to_end) {
    upto = c.bounds.back();  // sampled again from there once it is read
  } else if (!c.bounds.empty()) {
    upto = std::nullopt;  // the last ranges, to the end
  }
  return Sql(
      st().ExportStates(c.glob, from, upto, limit), "exporting states",
      [this, from, upto, limit](const std::string& body) -> Step {
        absl::StatusOr<Rows> rows = ParseTabSeparated(body, 3);
        if (!rows.ok()) return ExportFailed(rows.status());
        Result r = Base();
        r.states.emplace();
        r.states->reserve(rows->size());
        for (const Row& row : *rows) {
          MeltanoState state;
          state.state_id = row[0].value_or("");
          absl::StatusOr<nlohmann::json> partial = FromColumn(row[1], state.state_id, "partial_state");
          if (!partial.ok()) return ExportFailed(partial.status());
          absl::StatusOr<nlohmann::json> completed = FromColumn(row[2], state.state_id, "completed_state");
          if (!completed.ok()) return ExportFailed(completed.status());
          state.partial = std::move(*partial);
          state.completed = std::move(*completed);
          r.states->push_back(std::move(state));
        }
        Store::ExportCursor& c = *s_->export_;
        const bool full = static_cast<int64_t>(rows->size()) >= limit;
        // A full page may have stopped inside its range: the next one goes
        // on from its last id towards the same boundaries.
        const std::optional<std::string> reached = full ? std::optional<std::string>(r.states->back().state_id) : upto;
        while (!c.bounds.empty() && (!reached || c.bounds.front() <= *reached)) c.bounds.pop_front();
        if (!rows->empty()) {
          c.bytes_per_state = std::max<int64_t>(static_cast<int64_t>(body.size() / rows->size()), 1);
        }
        r.more = full || upto.has_value();
        if (r.more && r.states->empty()) return ExportRange(upto, limit);  // an empty range: on to the next
        if (r.more) {
          c.after = r.states->back().state_id;
        } else {
          s_->export_.reset();
        }
        return Step::Done(std::move(r));
      },
      [this](absl::Status st) { return ExportFailed(std::move(st)); });
}

// A failed page forgets the export (the next page samples afresh); a
// missing table is an export of no states.
Step StoreSteps::ExportFailed(absl::Status st) {
  s_->export_.reset();
  if (st.code() != absl::StatusCode::kNotFound) return Step::Fail(std::move(st));
  Result r = Base();
  r.states.emplace();
  return Step::Done(std::move(r));
}

}  // namespace chstate
