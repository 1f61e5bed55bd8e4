// Every default chstate applies, in one table: timeouts, the lock's timing
// and the transport retry policy. Hosts take these from the core (through
// StoreOptions, LockOptions, the resolved config, and chstate_defaults() in
// the C ABI) instead of keeping their own, and README's "Defaults" table and
// the CLI's --help are checked against kDefaults by core/defaults_test.cc.
//
//   int64_t ms = chstate::kDefaultRequestTimeoutMs;
//   for (const chstate::DefaultSetting& d : chstate::kDefaults) { ... d.name, d.value ... }
#ifndef CHSTATE_CORE_DEFAULTS_H_
#define CHSTATE_CORE_DEFAULTS_H_

#include <cstdint>

namespace chstate {

// TCP (and TLS) connection set-up.
inline constexpr int64_t kDefaultConnectTimeoutMs = 5000;
// One request: sending it and reading its whole answer.
inline constexpr int64_t kDefaultRequestTimeoutMs = 30000;
// A lock whose holder has not renewed it for this long is taken over: the
// lock's validity, Meltano's state_backend.lock_timeout_seconds, whose
// default (10 s) this is in every runtime. A holder renews every third of it.
inline constexpr int64_t kDefaultStaleLockMs = 10000;
// Between two attempts at a held lock (Meltano's lock_retry_seconds).
inline constexpr int64_t kDefaultLockRetryMs = 1000;
// How long acquiring a lock waits for another holder
// (state_backend.clickhouse.lock_wait_seconds): by default twice the
// validity plus one retry, long enough to take over the lock of a holder that
// died, so that a crashed run never fails the next one. The settings resolver
// computes it from the validity and retry given (core/settings.h).
inline constexpr int64_t kDefaultLockTimeoutMs = 2 * kDefaultStaleLockMs + kDefaultLockRetryMs;
// The shortest stale window (lock validity) a store accepts. The lease keeps
// a tenth of the window, at least 100 ms, as margin for a request in flight;
// the simulation proves exclusion from 1 s up with delays below that margin
// (tests/sim "odd-stale"), and nothing below.
inline constexpr int64_t kMinStaleLockMs = 1000;
// A 18.x ALTER ... DELETE may take this long to finish its mutation.
inline constexpr int64_t kDefaultMutationTimeoutMs = 60000;
// Cluster mode: how many replicas must confirm each write (insert_quorum).
// At least 2: below that ClickHouse makes no quorum writes, and sequentially
// consistent reads, which the lock's exclusion rests on, stop being so. Two
// of three replicas lets writes and locks go on with one replica down.
inline constexpr int kDefaultQuorum = 2;
// Cluster mode: how long a quorum write waits for the other replicas (code
// 319 after).
inline constexpr int64_t kDefaultQuorumTimeoutMs = 10000;
// Cluster mode: how long a write refused with code 286 (an earlier quorum
// write to the table is still unconfirmed: on 18.16, until the replica that
// holds it is back) keeps retrying. Longer than the quorum timeout, so that a
// replica restarted after a crash lets the writes go on.
inline constexpr int64_t kDefaultQuorumBusyMs = 30000;
// Cluster mode: how long ON CLUSTER DDL waits for every host (code 159 after).
inline constexpr int64_t kDefaultDdlTimeoutS = 10;
// Transport failures: a request is sent at most this many times in all
// (resent only when that cannot do harm: idempotent, or provably never sent).
inline constexpr int kDefaultTransportAttempts = 3;
// Wait before the first resend; doubled before each further one.
inline constexpr int64_t kDefaultTransportBackoffMs = 100;
// Several hosts (docs/cluster.md): a host that refused a connection, did
// not answer or gave a replica-level error is skipped this long.
inline constexpr int64_t kDefaultHostDownMs = 5000;

// linger_locks (a host that ticks in the background, such as the Meltano
// adapter): a released lock stays held by the store this long, renewed as
// usual, so that the next acquisition of the same id by this store costs no
// request. Released for real when idle this long, or as soon as another
// process has asked for it (kDefaultLockWaiterCheckMs).
inline constexpr int64_t kDefaultLockLingerMs = 1000;
// A lingering holder looks for processes waiting for the lock (their rows in
// the lock table) at most this often as it is released again and again (or
// every half of lock_retry_ms when that is shorter); after yielding to one it
// holds off for lock_retry_ms + kDefaultLockYieldMarginMs, so that the
// waiter's next attempt finds the lock free.
inline constexpr int64_t kDefaultLockWaiterCheckMs = 200;
inline constexpr int64_t kDefaultLockYieldMarginMs = 200;

// Cluster mode: `<table>_claims` keeps a row per claim, renewal and end. An
// acquisition that read this many claims of the id that no reader counts any
// more (ended, taken over, stale by their own window) removes them (an ALTER
// ... DELETE of those lock ids: asynchronous, replicated by the table), so the
// id's rows stay bounded by its claims of the last few seconds and a read of
// them costs the same after 100,000 acquisitions as after 10. A store does
// it for one id at most every kClaimsPruneEveryMs (the mutation takes a
// moment to land and should not be asked for again meanwhile).
inline constexpr int64_t kClaimsPruneAt = 32;
inline constexpr int64_t kClaimsPruneEveryMs = 10000;
// At most this many claims per removal (36 bytes each in the statement, which
// must stay below the server's max_query_size of 256 KiB); more (a backlog
// from before claims were removed) go a slice at a time at every acquisition.
inline constexpr int64_t kClaimsPruneMax = 5000;
// A claim is prunable as stale one second later than a taker may take it
// over (whole-second times); rows of a claim whose claim row never showed
// (its insert's outcome unknown) after a day.
inline constexpr int64_t kClaimPruneSlackS = 1;
inline constexpr int64_t kClaimOrphanS = 86400;

// State history keeps each version this many days (0: no history table).
inline constexpr int64_t kDefaultHistoryDays = 30;
// ... and at most this many versions of each id (0: no limit by count).
// Meltano writes a version per STATE message, so without a cap a pipeline
// that emits a STATE a second keeps 2.6 million versions of its id in 30
// days, each a whole state. A thousand keeps the versions rollback is for:
// hundreds of runs of a batch pipeline (a few STATE messages a run), the last
// quarter of an hour of a stream at one a second, and any version of the last
// day of an id written less than every minute and a half; more by setting it.
// A count, not a time window, since the rate of STATE messages varies by
// pipeline by orders of magnitude, and a count bounds the table either way.
inline constexpr int64_t kDefaultHistoryVersions = 1000;
// Both limits are kept as writes go, with no `chstate compact`: one write in
// this many (chosen by the write's random bytes) counts its id's versions and
// removes those beyond history_versions or older than history_days (an ALTER
// ... DELETE of that id's rows: a mutation on 18.x, which has no TTL). The
// look is one read of the id's versions, so it costs a write 1/64 of a read
// on average, and an id holds at most about history_versions + 64 versions.
inline constexpr int64_t kHistoryUpkeepEvery = 64;
// One server: the history view writes into a Buffer table in front of the
// history table, which the server flushes this long after its first row (or
// at the rows or bytes below), so a burst of writes makes one history part,
// not one per write. A server that stops without flushing (killed, power
// lost) loses at most this long of versions; the states themselves are
// written directly. Reads of the history flush it first.
inline constexpr int64_t kHistoryFlushSeconds = 10;
inline constexpr int64_t kHistoryBufferRows = 10000;
inline constexpr int64_t kHistoryBufferBytes = int64_t{64} << 20;
// `chstate history` lists at most this many versions unless told otherwise.
inline constexpr int64_t kDefaultHistoryLimit = 20;

// Export reads states a page at a time, each page one SELECT ... FINAL of a
// range of ids (bounded by a sample of the id column taken as the export
// starts), so the server reads each row about once and memory stays flat in
// the number of states. A page holds at most this many states, and about
// kDefaultExportPageBytes of them by the size of the states read so far:
// pages of 1,000 states cost 18.16 a query (about 2 ms, mostly fixed) per
// 1,000, twice the time of one scan at 1,000,000 states.
inline constexpr int64_t kDefaultExportPageStates = 10000;
inline constexpr int64_t kDefaultExportPageBytes = 4 * 1024 * 1024;
// The sample takes about one id in this many as a range boundary (the first
// page of an export is one such range), and at most this many boundaries at
// a time (an export beyond them samples again from where it is).
inline constexpr int64_t kExportSampleEvery = 1000;
inline constexpr int64_t kExportSampleCount = 10000;
// Import writes this many states per multi-row INSERT, fewer when their SQL
// (counted exactly, quoted) would pass kDefaultImportBatchBytes. Every INSERT
// makes a part (two, with the history's view) that the server merges again
// and again as more arrive: 1,000,000 states written raw on 18.16 took 16.5 s
// in INSERTs of 1,000 (31.7 million rows merged), 3.8 s of 10,000, 3.3 s of
// 30,000, 2.8 s of 50,000 and 2.9 s in one. The bytes bound what a batch
// holds in memory (its SQL, and the host's copy) whatever the states' size.
inline constexpr int64_t kDefaultImportBatchStates = 50000;
inline constexpr int64_t kDefaultImportBatchBytes = 16 * 1024 * 1024;

struct DefaultSetting {
  const char* name;     // the key in store options / the protocol's documents
  int64_t value;
  const char* unit;     // "ms", "s" or "count"
  const char* meaning;
};

inline constexpr DefaultSetting kDefaults[] = {
    {"connect_timeout_ms", kDefaultConnectTimeoutMs, "ms", "TCP/TLS connection set-up"},
    {"request_timeout_ms", kDefaultRequestTimeoutMs, "ms", "one request, sent and answered"},
    {"lock_timeout_ms", kDefaultLockTimeoutMs, "ms", "how long acquiring waits for another holder"},
    {"lock_retry_ms", kDefaultLockRetryMs, "ms", "between attempts at a held lock"},
    {"stale_lock_ms", kDefaultStaleLockMs, "ms", "a lock not renewed for this long is taken over"},
    {"mutation_timeout_ms", kDefaultMutationTimeoutMs, "ms", "18.x: a delete's mutation may run this long"},
    {"quorum", kDefaultQuorum, "count", "cluster: replicas that confirm each write (insert_quorum, 2 or more)"},
    {"quorum_timeout_ms", kDefaultQuorumTimeoutMs, "ms", "cluster: a write waits this long for its quorum"},
    {"quorum_busy_ms", kDefaultQuorumBusyMs, "ms",
     "cluster: a write refused because an earlier one is unconfirmed (code 286) retries this long"},
    {"ddl_timeout_s", kDefaultDdlTimeoutS, "s", "cluster: ON CLUSTER DDL waits this long for every host"},
    {"transport_attempts", kDefaultTransportAttempts, "count", "sends of one request in all, after transport failures"},
    {"transport_backoff_ms", kDefaultTransportBackoffMs, "ms", "before the first resend, doubled after"},
    {"host_down_ms", kDefaultHostDownMs, "ms", "several hosts: a host that failed is skipped this long"},
    {"lock_linger_ms", kDefaultLockLingerMs, "ms", "linger_locks: a released lock stays held this long for reuse"},
    {"lock_waiter_check_ms", kDefaultLockWaiterCheckMs, "ms",
     "linger_locks: a lingering holder looks for waiting processes at most this often"},
    {"lock_yield_margin_ms", kDefaultLockYieldMarginMs, "ms",
     "linger_locks: after yielding, the holder stays away lock_retry_ms plus this"},
    {"claims_prune_at", kClaimsPruneAt, "count",
     "cluster: an acquisition that read this many ended or stale claims of its id removes them"},
    {"claims_prune_every_ms", kClaimsPruneEveryMs, "ms", "cluster: a store removes one id's old claims at most this often"},
    {"claims_prune_max", kClaimsPruneMax, "count", "cluster: old claims removed per statement (a backlog: at every acquisition)"},
    {"history_days", kDefaultHistoryDays, "days", "state history: versions are kept this long (0: no history)"},
    {"history_versions", kDefaultHistoryVersions, "count", "state history: versions kept per id (0: no limit)"},
    {"history_upkeep_every", kHistoryUpkeepEvery, "count",
     "state history: one write in this many removes its id's versions beyond both limits"},
    {"history_flush_s", kHistoryFlushSeconds, "s",
     "state history, one server: versions wait in a Buffer table at most this long before their part is written"},
    {"history_buffer_rows", kHistoryBufferRows, "count", "state history, one server: the buffer is flushed at this many rows"},
    {"history_buffer_bytes", kHistoryBufferBytes, "bytes", "state history, one server: the buffer is flushed at this many bytes"},
    {"history_limit", kDefaultHistoryLimit, "count", "`chstate history`: versions listed"},
    {"export_page_states", kDefaultExportPageStates, "count", "export: states per page at most (one SELECT of a range of ids)"},
    {"export_page_bytes", kDefaultExportPageBytes, "bytes", "export: a page's states, by the size of those read before, about"},
    {"import_batch_states", kDefaultImportBatchStates, "count", "import: states per INSERT at most"},
    {"import_batch_bytes", kDefaultImportBatchBytes, "bytes", "import: SQL bytes per INSERT at most"},
};

}  // namespace chstate

#endif  // CHSTATE_CORE_DEFAULTS_H_
