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

namespace part {
namespace {

// After a write of `id`, one time in kHistoryUpkeepEvery (by the fresh
// random bytes of the write's answer): the id's versions beyond
// history_versions or older than history_days are removed. The write is
// done either way; a failure here is left to a later write.
struct UpkeepSteps {
  StoreSteps& s;
  const StoreOptions& o;
  std::string id;
  int64_t count = 0;
  int64_t expired = 0;
  Next Count(const Reply&) {
    const Inputs& in = s.inputs();
    if (o.history_days <= 0 || in.random.size() < 16 ||
        static_cast<unsigned char>(in.random[15]) % kHistoryUpkeepEvery != 0) {
      return Next::Done();
    }
    return Next::Send(s.st().HistoryOverLimits(id, o.history_versions, o.history_days));
  }
  Next Trim(const Reply& r) {
    absl::StatusOr<Rows> rows = s.AnswerRows(r, "counting the state's versions", 3);
    int64_t cutoff_ms = 0;
    if (!rows.ok() || rows->empty() || !absl::SimpleAtoi((*rows)[0][0].value_or(""), &count) ||
        !absl::SimpleAtoi((*rows)[0][1].value_or(""), &expired) ||
        !absl::SimpleAtoi((*rows)[0][2].value_or(""), &cutoff_ms)) {
      return Next::Done();
    }
    const bool over_count = o.history_versions > 0 && count > o.history_versions && cutoff_ms > 0;
    if (!over_count && expired == 0) return Next::Done();
    return Next::Try(s.SqlPart(s.st().TrimHistoryOf(id, over_count ? cutoff_ms : 0, o.history_days),
                               "removing the state's old versions"));
  }
  Next Tell(const Reply& r) {
    if (r.status.ok()) {
      s.Tell(DiagnosticKind::kHistoryPruned, DiagnosticLevel::kDebug, id,
             absl::StrCat("the history of \"", PrintableId(id), "\" was kept in bounds: it held ", count,
                          " versions (", expired, " past ", o.history_days, " days; at most ", o.history_versions,
                          " are kept)"),
             {{"versions", count}, {"expired", expired}, {"cap", o.history_versions}});
    }
    return Next::Done();
  }
  std::string Where(size_t) const { return absl::StrCat("keeping the history of \"", PrintableId(id), "\" in bounds"); }
};

}  // namespace
}  // namespace part

std::unique_ptr<Op> StoreSteps::HistoryUpkeepPart(const std::string& id) {
  using U = part::UpkeepSteps;
  return Steps<U>({&U::Count, &U::Trim, &U::Tell}, *this, options(), id);
}

// Before a read of the history on one server: the buffer's rows into the
// table. Tried: a schema from before the buffer (code 60) or a user who may
// not OPTIMIZE (readonly) reads the table as it is, without the versions of
// the last few seconds at most.
std::unique_ptr<Op> StoreSteps::FlushHistoryPart() {
  return SqlPart(st().FlushHistory(), "writing the state history buffer into its table");
}

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

namespace {

// Before a read of the history: its buffer flushed, when there is one.
Next FlushIfBuffered(StoreSteps& s) {
  return s.st().HistoryBuffered() ? Next::Try(s.FlushHistoryPart()) : Next::GoOn();
}

// history: the id's versions, newest first; the one the state table holds
// now is marked current. A missing history reads as no versions.
struct HistorySteps {
  StoreSteps& s;
  std::string id;
  int64_t limit;
  std::vector<StateVersion> versions;
  std::optional<MeltanoState> now;
  Next Connect(const Reply&) { return Next::Call(part::Connect(s)); }
  Next Flush(const Reply&) { return FlushIfBuffered(s); }
  Next List(const Reply&) { return Next::Send(s.st().ListHistory(id, limit)); }
  Next ReadCurrent(const Reply& r) {
    absl::StatusOr<Rows> rows = s.AnswerRows(r, "reading the state history", 5);
    if (!rows.ok() && rows.status().code() != absl::StatusCode::kNotFound) return Next::Fail(rows.status());
    if (rows.ok()) {
      absl::StatusOr<std::vector<StateVersion>> read = StoreSteps::Versions(id, *rows);
      if (!read.ok()) return Next::Fail(read.status());
      versions = *std::move(read);
    }
    return Next::Call(part::ReadState(s, id, &now));
  }
  Next Done(const Reply&) {
    // 18.x keeps whole seconds: among the newest second's versions, the one
    // the state table holds is the newest.
    std::vector<StateVersion>& v = versions;
    for (size_t i = 0; now && i < v.size() && v[i].unix_ms == v[0].unix_ms; ++i) {
      if (v[i].state.partial == now->partial && v[i].state.completed == now->completed) {
        v[i].current = true;
        std::rotate(v.begin(), v.begin() + i, v.begin() + i + 1);
        break;
      }
    }
    Result out = s.Base();
    out.versions = std::move(v);
    return Next::Done(std::move(out));
  }
  std::string Where(size_t) const { return absl::StrCat("history \"", PrintableId(id), "\""); }
};

// rollback: a version restored under the id's lock: read from the history
// and written as the state (a new version).
struct RollbackSteps {
  StoreSteps& s;
  std::string id;
  std::string version;
  int64_t unix_ms;
  std::string hash8;
  MeltanoState restored;
  // Under the lock: the version read and written.
  struct Restoring {
    RollbackSteps* r;
    Next Flush(const Reply&) { return FlushIfBuffered(r->s); }
    Next Read(const Reply&) { return Next::Send(r->s.st().GetHistoryVersion(r->id, r->unix_ms, r->hash8)); }
    Next Write(const Reply& a) {
      absl::StatusOr<Rows> rows = r->s.AnswerRows(a, "reading a version from the state history", 5);
      if (!rows.ok()) return Next::Fail(rows.status().code() == absl::StatusCode::kNotFound ? r->Missing() : rows.status());
      absl::StatusOr<std::vector<StateVersion>> found = StoreSteps::Versions(r->id, *rows);
      if (!found.ok()) return Next::Fail(found.status());
      if (found->empty()) return Next::Fail(r->Missing());
      r->restored = std::move(found->front().state);
      return Next::Call(part::WriteState(r->s, r->restored));
    }
    std::string Where(size_t) const { return absl::StrCat("restoring version ", r->version); }
  };
  absl::Status Missing() const {
    return absl::NotFoundError(absl::StrCat("state id \"", PrintableId(id), "\" has no version ", version,
                                            " in its history; `chstate history ID` lists the versions kept"));
  }
  Next Connect(const Reply&) { return Next::Call(part::Connect(s)); }
  Next Restore(const Reply&) {
    return Next::Call(
        part::Locked(s, id, Steps<Restoring>({&Restoring::Flush, &Restoring::Read, &Restoring::Write}, this)));
  }
  Next Done(const Reply&) { return Next::Done(s.Base(restored)); }
  std::string Where(size_t) const { return absl::StrCat("rollback \"", PrintableId(id), "\" to ", version); }
};

// list: the ids matching a glob, sorted; a missing table is no ids.
struct ListSteps {
  StoreSteps& s;
  std::optional<std::string> glob;
  Next Connect(const Reply&) { return Next::Call(part::Connect(s)); }
  Next List(const Reply&) { return Next::Send(s.st().ListStateIds(glob)); }
  Next Done(const Reply& r) {
    absl::StatusOr<Rows> rows = s.AnswerRows(r, "listing state ids", 2);
    if (!rows.ok()) {
      if (rows.status().code() == absl::StatusCode::kNotFound) return Next::Done(s.Base());
      return Next::Fail(rows.status());
    }
    Result out = s.Base();
    for (const Row& row : *rows) out.state_ids.push_back(row[0].value_or(""));
    return Next::Done(std::move(out));
  }
  std::string Where(size_t) const { return "list"; }
};

// export: one page (Store::ExportPage). Its ranges' upper ends come from a
// sample of the ids kept in the store's export cursor between pages; a
// page that continues the export this store returned last goes on from the
// cursor, any other samples afresh. An empty range moves on to the next;
// bounds that run out are sampled again from where the export is.
class ExportPageOp final : public StorePart {
 public:
  ExportPageOp(StoreSteps& s, std::optional<std::string> glob, std::optional<std::string> after, int64_t limit,
               bool document)
      : StorePart(s), glob_(std::move(glob)), from_(std::move(after)), limit_(limit), document_(document) {}
  std::string Where() const override {
    return stage_ == Stage::kSampling ? "sampling state ids to export" : "exporting states";
  }

  Next Resume(const Reply& r) override {
    switch (stage_) {
      case Stage::kStart:
        stage_ = Stage::kConnecting;
        return Next::Call(part::Connect(s_));
      case Stage::kConnecting: {
        std::optional<StoreSteps::ExportCursor>& c = s_.export_cursor();
        if (c && from_ && c->after == from_ && c->glob == glob_) return ReadRange();
        c = StoreSteps::ExportCursor{glob_, from_};
        return Sample();
      }
      case Stage::kSampling:
        return Sampled(r);
      case Stage::kReading:
        return Read(r);
    }
    return Next::Fail(absl::InternalError("export: no such stage"));
  }

 private:
  Next Sample() {
    stage_ = Stage::kSampling;
    return Next::Send(s_.st().SampleStateIds(s_.export_cursor()->glob, from_, kExportSampleEvery, kExportSampleCount));
  }

  Next Sampled(const Reply& r) {
    absl::StatusOr<Rows> rows = s_.AnswerRows(r, "sampling state ids to export", 2);
    if (!rows.ok()) return Failed(rows.status());
    StoreSteps::ExportCursor& c = *s_.export_cursor();
    c.bounds.clear();
    for (const Row& row : *rows) {
      std::string id = row[0].value_or("");
      // Sorted by the server; kept strictly ascending and beyond `from`
      // whatever it sent, so that every range is well formed.
      if ((from_ && id <= *from_) || (!c.bounds.empty() && id <= c.bounds.back())) continue;
      c.bounds.push_back(std::move(id));
    }
    c.sampled_to_end = static_cast<int64_t>(rows->size()) < kExportSampleCount || c.bounds.empty();
    return ReadRange();
  }

  // The states after from_ up to the next boundaries (as many ranges as
  // make about kDefaultExportPageBytes, at most limit_ states).
  Next ReadRange() {
    StoreSteps::ExportCursor& c = *s_.export_cursor();
    if (c.bounds.empty() && !c.sampled_to_end) return Sample();
    // The first page is one range; later ones as many as the size of the
    // states read so far lets into the byte budget.
    size_t ranges = 1;
    if (c.bytes_per_state > 0) {
      const int64_t states = std::min(limit_, kDefaultExportPageBytes / c.bytes_per_state);
      ranges = static_cast<size_t>(std::max<int64_t>(states / kExportSampleEvery, 1));
    }
    upto_ = std::nullopt;
    if (c.bounds.size() >= ranges) {
      upto_ = c.bounds[ranges - 1];
    } else if (!c.bounds.empty() && !c.sampled_to_end) {
      upto_ = c.bounds.back();  // sampled again from there once it is read
    }  // else the last ranges, to the end
    stage_ = Stage::kReading;
    return Next::Send(s_.st().ExportStates(c.glob, from_, upto_, limit_));
  }

  Next Read(const Reply& r) {
    absl::StatusOr<std::string> body = s_.Answer(r, "exporting states");
    if (!body.ok()) return Failed(body.status());
    absl::StatusOr<Rows> rows = ParseTabSeparated(*body, 3);
    if (!rows.ok()) return Failed(rows.status());
    Result out = s_.Base();
    if (document_) {
      // The entries of the export document, written from the columns.
      out.document.emplace();
      out.document->reserve(body->size() + body->size() / 4);
      out.state_ids.reserve(rows->size());
      ExportEntryWriter writer;
      for (const Row& row : *rows) {
        std::string id = row[0].value_or("");
        if (!out.state_ids.empty()) out.document->append(",\n  ");
        if (absl::Status st = writer.Append(id, row[1], row[2], &*out.document); !st.ok()) return Failed(st);
        out.state_ids.push_back(std::move(id));
      }
      const size_t count = out.state_ids.size();  // before out is moved
      return Paged(std::move(out), count, body->size());
    }
    out.states.emplace();
    out.states->reserve(rows->size());
    for (const Row& row : *rows) {
      MeltanoState state;
      state.state_id = row[0].value_or("");
      absl::StatusOr<nlohmann::json> partial = FromColumn(row[1], state.state_id, "partial_state");
      if (!partial.ok()) return Failed(partial.status());
      absl::StatusOr<nlohmann::json> completed = FromColumn(row[2], state.state_id, "completed_state");
      if (!completed.ok()) return Failed(completed.status());
      state.partial = std::move(*partial);
      state.completed = std::move(*completed);
      out.states->push_back(std::move(state));
    }
    const size_t count = out.states->size();  // before out is moved
    return Paged(std::move(out), count, body->size());
  }

  // The page read (`rows` states from `bytes` of answer), its last id the
  // last of out.states or of out.state_ids: done, or on to the next range
  // when it was empty.
  Next Paged(Result out, size_t rows, size_t bytes) {
    auto last_id = [&]() -> const std::string& {
      return document_ ? out.state_ids.back() : out.states->back().state_id;
    };
    StoreSteps::ExportCursor& c = *s_.export_cursor();
    const bool full = static_cast<int64_t>(rows) >= limit_;
    // A full page may have stopped inside its range: the next one goes on
    // from its last id towards the same boundaries.
    const std::optional<std::string> reached = full ? std::optional<std::string>(last_id()) : upto_;
    while (!c.bounds.empty() && (!reached || c.bounds.front() <= *reached)) c.bounds.pop_front();
    if (rows > 0) c.bytes_per_state = std::max<int64_t>(static_cast<int64_t>(bytes / rows), 1);
    out.more = full || upto_.has_value();
    if (out.more && rows == 0) {  // an empty range: on to the next
      from_ = upto_;
      return ReadRange();
    }
    if (out.more) {
      c.after = last_id();
    } else {
      s_.export_cursor().reset();
    }
    return Next::Done(std::move(out));
  }

  // A failed page forgets the export (the next page samples afresh); a
  // missing table is an export of no states.
  Next Failed(absl::Status st) {
    s_.export_cursor().reset();
    if (st.code() != absl::StatusCode::kNotFound) return Next::Fail(std::move(st));
    Result out = s_.Base();
    if (document_) {
      out.document.emplace();
    } else {
      out.states.emplace();
    }
    return Next::Done(std::move(out));
  }

  enum class Stage { kStart, kConnecting, kSampling, kReading };
  Stage stage_ = Stage::kStart;
  std::optional<std::string> glob_;
  std::optional<std::string> from_;  // the last id exported before the range being read
  int64_t limit_;
  bool document_;  // the page as the export document's entries (Result::document), not states
  std::optional<std::string> upto_;  // the range's upper end (nullopt: to the end)
};

// import: the states in multi-row INSERTs of at most kDefaultImportBatchStates
// states and kDefaultImportBatchBytes of SQL, creating the schema once if it
// is missing. A failure names how many were written.
class ImportOp final : public StorePart {
 public:
  ImportOp(StoreSteps& s, std::shared_ptr<const std::vector<StoredState>> all) : StorePart(s), all_(std::move(all)) {}
  std::string Where() const override {
    return absl::StrCat("import (", from_, " of ", all_->size(), " written)");
  }

  Next Resume(const Reply& r) override {
    switch (stage_) {
      case Stage::kStart:
        stage_ = Stage::kConnecting;
        return Next::Call(part::Connect(s_));
      case Stage::kConnecting:
        return WriteBatch();
      case Stage::kWriting:
        if (r.status.ok()) {
          from_ = next_;
          schema_made_ = true;
          return WriteBatch();
        }
        if (r.status.code() == absl::StatusCode::kNotFound && !schema_made_) {
          stage_ = Stage::kMakingSchema;
          return Next::Call(part::EnsureSchema(s_));
        }
        return Next::Fail(absl::Status(
            r.status.code(),
            absl::StrCat(r.status.message(), "; the import stopped after ", from_, " of ", all_->size(),
                         " states were written (in the order written: by id for a document, as given for a list). "
                         "Importing the same states again is safe: each write overwrites the whole state")));
      case Stage::kMakingSchema:
        schema_made_ = true;
        return WriteBatch();
    }
    return Next::Fail(absl::InternalError("import: no such stage"));
  }

 private:
  Next WriteBatch() {
    const std::vector<StoredState>& states = *all_;
    if (from_ >= states.size()) {
      Result out = s_.Base();
      out.count = static_cast<int64_t>(states.size());
      return Next::Done(std::move(out));
    }
    // Each state's row as it goes into the statement: the VALUES list's exact
    // size (quoting and the ", " between rows included) is kept within
    // kDefaultImportBatchBytes, though a row alone is always sent.
    std::vector<std::string> rows;
    int64_t bytes = 0;
    next_ = from_;
    for (; next_ < states.size() && static_cast<int64_t>(rows.size()) < kDefaultImportBatchStates; ++next_) {
      const StoredState& state = states[next_];
      if (absl::Status lease = s_.LeaseCheck(state.state_id); !lease.ok()) return Next::Fail(lease);
      std::string row = Statements::StateRowSql(state);
      const int64_t size = static_cast<int64_t>(row.size()) + (rows.empty() ? 0 : 2);
      if (!rows.empty() && bytes + size > kDefaultImportBatchBytes) break;
      bytes += size;
      rows.push_back(std::move(row));
    }
    absl::StatusOr<std::string> token = s_.Token();
    if (!token.ok()) return Next::Fail(token.status());
    SqlRequest req = s_.st().InsertStateRows(rows, *token);
    for (size_t i = from_; i < next_; ++i) req = s_.UnderLease(std::move(req), states[i].state_id);
    stage_ = Stage::kWriting;
    return Next::Try(part::QuorumWrite(s_, std::move(req),
                                       absl::StrCat("importing states ", from_ + 1, "-", next_, " of ", states.size()),
                                       s_.inputs().now_ms + s_.options().cluster.quorum_busy_ms, 5));
  }

  enum class Stage { kStart, kConnecting, kWriting, kMakingSchema };
  Stage stage_ = Stage::kStart;
  std::shared_ptr<const std::vector<StoredState>> all_;
  size_t from_ = 0;
  size_t next_ = 0;
  bool schema_made_ = false;
};

}  // namespace

std::unique_ptr<Task> Store::History(std::string state_id, int64_t limit) {
  if (absl::Status st = ValidateStateId(state_id); !st.ok()) return Invalid(st);
  if (limit < 1) return Invalid(absl::InvalidArgumentError("a history lists at least one version"));
  return MakeOpTask(this, [&](StoreSteps& s) {
    using H = HistorySteps;
    return Steps<H>({&H::Connect, &H::Flush, &H::List, &H::ReadCurrent, &H::Done}, s, state_id, limit);
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
  return MakeOpTask(this, [&](StoreSteps& s) {
    using R = RollbackSteps;
    return Steps<R>({&R::Connect, &R::Restore, &R::Done}, s, state_id, version, unix_ms, hash8);
  });
}

std::unique_ptr<Task> Store::List(std::optional<std::string> glob) {
  return MakeOpTask(this, [&](StoreSteps& s) { return Steps<ListSteps>({&ListSteps::Connect, &ListSteps::List, &ListSteps::Done}, s, glob); });
}

std::unique_ptr<Task> Store::ExportPage(std::optional<std::string> glob, std::optional<std::string> after,
                                        int64_t limit, bool document) {
  if (limit < 1) return Invalid(absl::InvalidArgumentError("an export page holds at least one state"));
  if (after) {
    if (absl::Status st = ValidateStateId(*after); !st.ok()) return Invalid(st);
  }
  // What continues is looked at when the task starts (see RenewLock).
  return MakeOpTask(this, [&](StoreSteps& s) {
    return std::make_unique<ExportPageOp>(s, glob, after, limit, document);
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
  std::vector<StoredState> rows;
  rows.reserve(states.size());
  for (MeltanoState& st : states) {
    rows.push_back(StoredState{std::move(st.state_id), ToColumn(st.partial), ToColumn(st.completed)});
    st = MeltanoState{};  // the sides' trees go as their text is made
  }
  auto all = std::make_shared<const std::vector<StoredState>>(std::move(rows));
  return MakeOpTask(this, [&](StoreSteps& s) { return std::make_unique<ImportOp>(s, all); });
}

std::unique_ptr<Task> Store::ImportRows(std::vector<StoredState> rows) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (absl::Status st = ValidateStateId(rows[i].state_id); !st.ok()) {
      return Invalid(absl::InvalidArgumentError(
          absl::StrCat("import row ", i + 1, " of ", rows.size(), ": ", st.message(), "; nothing was written")));
    }
    if (i > 0 && !(rows[i - 1].state_id < rows[i].state_id)) {
      return Invalid(absl::InvalidArgumentError(absl::StrCat(
          "import rows ", i, " and ", i + 1, " are not in increasing id order (\"", PrintableId(rows[i - 1].state_id),
          "\", then \"", PrintableId(rows[i].state_id), "\"); nothing was written")));
    }
  }
  auto all = std::make_shared<const std::vector<StoredState>>(std::move(rows));
  return MakeOpTask(this, [&](StoreSteps& s) { return std::make_unique<ImportOp>(s, all); });
}

}  // namespace chstate
