// Fuzzes the JSON state model (core/state.h): parsing, the dump/parse and
// column round trips, Meltano's DeepMerge and update rules.
//
// Properties: nothing throws or crashes; an error message is printable
// ASCII; a parsed document dumps and re-parses to an equal document, and
// survives ToColumn/FromColumn; DeepMerge keeps every key of `over`, keeps
// the keys only `base` has, recurses where both sides are objects, and is
// idempotent; ApplyUpdate follows Meltano's StateStoreManager.update().
#include <cstddef>
#include <cstdint>
#include <string>

#include <fuzzer/FuzzedDataProvider.h>

#include "core/state.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using json = nlohmann::json;

void CheckMessage(const absl::Status& s) {
  FUZZ_CHECK(!s.ok());
  FUZZ_CHECK(chstate_fuzz::PrintableAscii(std::string(s.message())), std::string(s.message()));
}

// The document a parse gave must survive our own serialisation.
void CheckRoundTrip(const json& j) {
  const std::string text = chstate::DumpJson(j);
  absl::StatusOr<json> again = chstate::ParseStateJson(text);
  FUZZ_CHECK(again.ok(), "dump did not re-parse: " + text + " -> " + std::string(again.status().message()));
  FUZZ_CHECK(*again == j, "dump changed the document: " + text);
  std::optional<std::string> column = chstate::ToColumn(j);
  FUZZ_CHECK(column.has_value() == !j.empty());
  absl::StatusOr<json> back = chstate::FromColumn(column, "id", "completed_state");
  FUZZ_CHECK(back.ok() && *back == j, "column round trip changed the document: " + text);
}

void CheckMerge(const json& base, const json& over) {
  const json m = chstate::DeepMerge(base, over);
  FUZZ_CHECK(m.is_object());
  for (auto it = over.begin(); it != over.end(); ++it) {
    FUZZ_CHECK(m.contains(it.key()), "merge lost a key of the partial side: " + it.key());
    const json& got = m.at(it.key());
    if (it->is_object() && base.contains(it.key()) && base.at(it.key()).is_object()) {
      FUZZ_CHECK(got == chstate::DeepMerge(base.at(it.key()), *it), "merge did not recurse at " + it.key());
    } else {
      FUZZ_CHECK(got == *it, "merge did not take the partial side's value at " + it.key());
    }
  }
  for (auto it = base.begin(); it != base.end(); ++it) {
    if (!over.contains(it.key())) FUZZ_CHECK(m.at(it.key()) == *it, "merge changed " + it.key());
  }
  FUZZ_CHECK(m.size() <= base.size() + over.size());
  FUZZ_CHECK(chstate::DeepMerge(m, over) == m, "merge is not idempotent");
  FUZZ_CHECK(chstate::DeepMerge(base, json::object()) == base);
  FUZZ_CHECK(chstate::DeepMerge(json::object(), over) == over);
  CheckRoundTrip(m);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const bool require_singer = in.ConsumeBool();
  const std::string a = in.ConsumeRandomLengthString(size);
  const std::string b = in.ConsumeRemainingBytesAsString();

  absl::StatusOr<json> pa = chstate::ParseStateJson(a);
  absl::StatusOr<json> pb = chstate::ParseStateJson(b);
  if (pa.ok()) {
    FUZZ_CHECK(pa->is_object());
    CheckRoundTrip(*pa);
  } else {
    CheckMessage(pa.status());
  }
  if (!pb.ok()) CheckMessage(pb.status());
  if (pa.ok() && pb.ok()) CheckMerge(*pa, *pb);

  // Meltano's whole-state form and `meltano state set` input.
  absl::StatusOr<chstate::MeltanoState> whole = chstate::ParseMeltanoStateJson("id", a);
  if (whole.ok()) {
    FUZZ_CHECK(whole->partial.is_object() && whole->completed.is_object());
    absl::StatusOr<chstate::MeltanoState> again =
        chstate::ParseMeltanoStateJson("id", chstate::DumpJson(whole->ToJson()));
    FUZZ_CHECK(again.ok() && again->partial == whole->partial && again->completed == whole->completed,
               "whole state did not round-trip");
  } else {
    CheckMessage(whole.status());
  }
  absl::StatusOr<chstate::MeltanoState> set = chstate::CompleteStateFromInput("id", b, require_singer);
  if (set.ok()) {
    FUZZ_CHECK(set->partial.empty() && set->completed.is_object());
    if (require_singer) FUZZ_CHECK(set->completed.contains("singer_state"));
  } else {
    CheckMessage(set.status());
  }

  // Meltano's update(): a partial incoming state merges into the current
  // partial side and keeps the completed side; a complete one replaces.
  if (whole.ok() && pb.ok()) {
    chstate::MeltanoState incoming{"id", *pb, json::object()};
    chstate::MeltanoState result = chstate::ApplyUpdate(*whole, incoming);
    if (incoming.IsComplete()) {
      FUZZ_CHECK(result.partial == incoming.partial && result.completed == incoming.completed);
    } else {
      FUZZ_CHECK(result.completed == whole->completed, "update lost the completed side");
      FUZZ_CHECK(result.partial == chstate::DeepMerge(whole->partial, incoming.partial));
    }
    chstate::MeltanoState fresh = chstate::ApplyUpdate(std::nullopt, incoming);
    FUZZ_CHECK(fresh.partial == incoming.partial && fresh.completed == incoming.completed);
  }
  return 0;
}
