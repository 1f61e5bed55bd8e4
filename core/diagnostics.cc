// The diagnostics queue and statement redaction (diagnostics.h).
#include "core/diagnostics.h"

#include "absl/strings/str_cat.h"

namespace chstate {

const char* DiagnosticKindName(DiagnosticKind kind) {
  switch (kind) {
    case DiagnosticKind::kLockWaiting: return "lock_waiting";
    case DiagnosticKind::kLockAcquired: return "lock_acquired";
    case DiagnosticKind::kLeaseRenewed: return "lease_renewed";
    case DiagnosticKind::kLeaseLost: return "lease_lost";
    case DiagnosticKind::kLockYielded: return "lock_yielded";
    case DiagnosticKind::kResent: return "resent";
    case DiagnosticKind::kHostDown: return "host_down";
    case DiagnosticKind::kQuorumBusy: return "quorum_busy";
    case DiagnosticKind::kHistoryPruned: return "history_pruned";
    case DiagnosticKind::kStatement: return "statement";
  }
  return "?";
}

const char* DiagnosticLevelName(DiagnosticLevel level) {
  switch (level) {
    case DiagnosticLevel::kWarning: return "warning";
    case DiagnosticLevel::kInfo: return "info";
    case DiagnosticLevel::kDebug: return "debug";
    case DiagnosticLevel::kNone: return "none";
  }
  return "?";
}

void Diagnostics::Emit(Diagnostic d) {
  if (!Wants(d.level)) return;
  if (queue_.size() >= kMaxQueued) queue_.pop_front();
  queue_.push_back(std::move(d));
}

std::optional<Diagnostic> Diagnostics::Poll() {
  if (queue_.empty()) return std::nullopt;
  Diagnostic d = std::move(queue_.front());
  queue_.pop_front();
  return d;
}

std::string DiagnosticLine(const Diagnostic& d) {
  std::string line = d.message;
  if (d.kind != DiagnosticKind::kStatement) return line;
  for (const auto& [name, text] : d.texts) {
    if (name != "sql") continue;
    absl::StrAppend(&line, ": ");
    // A break and the indentation after it become one space.
    bool in_break = false;
    for (const char c : text) {
      if (c == '\n' || c == '\r') {
        in_break = true;
        continue;
      }
      if (in_break && (c == ' ' || c == '\t')) continue;
      if (in_break) line.push_back(' ');
      in_break = false;
      line.push_back(c);
    }
  }
  return line;
}

std::string RedactStates(absl::string_view sql) {
  // The core quotes literals with QuoteStringLiteral: '...' with \' and \\
  // escaped, so a literal ends at the first ' not preceded by an escape.
  std::string out;
  out.reserve(sql.size() < 4096 ? sql.size() : 4096);
  size_t i = 0;
  while (i < sql.size()) {
    const char c = sql[i];
    if (c != '\'') {
      out.push_back(c);
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < sql.size() && sql[j] != '\'') j += sql[j] == '\\' ? 2 : 1;
    const bool closed = j < sql.size();
    const size_t end = closed ? j + 1 : sql.size();
    absl::string_view literal = sql.substr(i, end - i);
    if (literal.size() >= 2 && literal[1] == '{') {
      absl::StrAppend(&out, "'<state: ", literal.size() - (closed ? 2 : 1), " bytes>", closed ? "'" : "");
    } else {
      absl::StrAppend(&out, literal);
    }
    i = end;
  }
  return out;
}

}  // namespace chstate
