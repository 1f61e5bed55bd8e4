// Every ClickHouse error code the core interprets, in one place, with what
// it means and what the core does with it. A code not listed here ends an
// operation with kInternal and the server's message (core/response.h).
//
//   if (chstate::ClickHouseCode(status) == chstate::ch::kTableAlreadyExists) ...
//   const chstate::ch::ErrorCode* e = chstate::ch::Find(286);   // e->name, e->handling
#ifndef CHSTATE_CORE_CLICKHOUSE_ERRORS_H_
#define CHSTATE_CORE_CLICKHOUSE_ERRORS_H_

namespace chstate::ch {

inline constexpr int kTableAlreadyExists = 57;      // CREATE of an existing table: the lock is held
inline constexpr int kUnknownTable = 60;            // no state/lock table (yet, or any more)
inline constexpr int kUnknownDatabase = 81;         // no state database
inline constexpr int kTimeoutExceeded = 159;        // e.g. ON CLUSTER DDL not run by every host in time
inline constexpr int kBadArguments = 170;           // also "Requested cluster ... not found"
inline constexpr int kUnknownUser = 192;
inline constexpr int kWrongPassword = 193;
inline constexpr int kRequiredPassword = 194;
inline constexpr int kTooManySimultaneousQueries = 202;
inline constexpr int kSocketTimeout = 209;
inline constexpr int kNetworkError = 210;
inline constexpr int kTableIsDropped = 218;         // a query met a table being dropped
inline constexpr int kNoZooKeeper = 225;
inline constexpr int kTableIsReadOnly = 242;        // replicated table without its ZooKeeper session
inline constexpr int kTooManyParts = 252;        // inserts outran merges: nothing written, retry after a pause
inline constexpr int kTooFewLiveReplicas = 285;     // quorum write: fewer replicas alive than the quorum
inline constexpr int kUnsatisfiedQuorumForPreviousWrite = 286;  // another quorum write not finished: nothing written
inline constexpr int kReplicaIsNotInQuorum = 289;  // a sequentially consistent read on a lagging replica
inline constexpr int kUnknownStatusOfInsert = 319;  // quorum not confirmed in time: outcome unknown
inline constexpr int kSystemError = 425;
inline constexpr int kReadonly = 164;               // the user's profile is read-only
inline constexpr int kDatabaseAccessDenied = 291;   // 18.x: the database is not in the user's allow_databases
inline constexpr int kQueryIsProhibited = 392;      // 18.x: DDL with allow_ddl = 0
inline constexpr int kThrowIfValueIsNonZero = 395;  // a fenced state write whose lock is not the writer's
inline constexpr int kAccessDenied = 497;
inline constexpr int kAuthenticationFailed = 516;
inline constexpr int kKeeperException = 999;        // ZooKeeper/Keeper session or connection error

struct ErrorCode {
  int code;
  const char* name;      // ClickHouse's own name for it
  const char* handling;  // what the core does
};

inline constexpr ErrorCode kInterpreted[] = {
    {kTableAlreadyExists, "TABLE_ALREADY_EXISTS", "lock: CREATE lost the race, inspect the holder"},
    {kUnknownTable, "UNKNOWN_TABLE", "reads as absent; writes create the schema once; kNotFound otherwise"},
    {kUnknownDatabase, "UNKNOWN_DATABASE", "as UNKNOWN_TABLE"},
    {kTimeoutExceeded, "TIMEOUT_EXCEEDED", "kUnavailable; lock: an ON CLUSTER CREATE is resolved by inspection"},
    {kBadArguments, "BAD_ARGUMENTS", "cluster mode, 'Requested cluster': kInvalidArgument naming the setting"},
    {kReadonly, "READONLY",
     "kPermissionDenied, naming readonly (docs/operations.md); 'Replica is not active' (a quorum write while the "
     "replica's ZooKeeper session is restored): as TABLE_IS_READ_ONLY"},
    {kUnknownUser, "UNKNOWN_USER", "kUnauthenticated"},
    {kWrongPassword, "WRONG_PASSWORD", "kUnauthenticated"},
    {kRequiredPassword, "REQUIRED_PASSWORD", "kUnauthenticated"},
    {kTooManySimultaneousQueries, "TOO_MANY_SIMULTANEOUS_QUERIES", "kUnavailable: retry later"},
    {kSocketTimeout, "SOCKET_TIMEOUT", "kUnavailable: retry later"},
    {kNetworkError, "NETWORK_ERROR", "kUnavailable: retry later"},
    {kTableIsDropped, "TABLE_IS_DROPPED", "lock: the lock table vanished under the read, read again"},
    {kNoZooKeeper, "NO_ZOOKEEPER", "cluster mode: kUnavailable, 'ClickHouse cannot reach ZooKeeper'"},
    {kTableIsReadOnly, "TABLE_IS_READ_ONLY", "cluster mode: kUnavailable, as NO_ZOOKEEPER"},
    {kTooManyParts, "TOO_MANY_PARTS", "cluster mode: retried like UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE"},
    {kDatabaseAccessDenied, "DATABASE_ACCESS_DENIED", "kPermissionDenied, naming allow_databases (docs/operations.md)"},
    {kTooFewLiveReplicas, "TOO_FEW_LIVE_REPLICAS", "cluster mode: kUnavailable, nothing was written"},
    {kUnsatisfiedQuorumForPreviousWrite, "UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE",
     "cluster mode: retried until quorum_busy_ms, then kUnavailable"},
    {kReplicaIsNotInQuorum, "REPLICA_IS_NOT_IN_QUORUM",
     "several hosts: the read goes to another replica; all lagging: kUnavailable, retry later"},
    {kUnknownStatusOfInsert, "UNKNOWN_STATUS_OF_INSERT", "cluster mode: a write that replaces itself is sent once more, elsewhere; then kUnavailable, outcome explained"},
    {kSystemError, "SYSTEM_ERROR", "kUnavailable: retry later"},
    {kQueryIsProhibited, "QUERY_IS_PROHIBITED", "kPermissionDenied, naming allow_ddl (docs/operations.md)"},
    {kThrowIfValueIsNonZero, "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO",
     "a fenced state write: the lock is not the writer's any more, kAborted, nothing was written"},
    {kAccessDenied, "ACCESS_DENIED", "kPermissionDenied"},
    {kAuthenticationFailed, "AUTHENTICATION_FAILED", "kUnauthenticated"},
    {kKeeperException, "KEEPER_EXCEPTION", "cluster mode: kUnavailable, as NO_ZOOKEEPER"},
};

// The entry for `code`, or nullptr when the core does not interpret it.
constexpr const ErrorCode* Find(int code) {
  for (const ErrorCode& e : kInterpreted) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

}  // namespace chstate::ch

#endif  // CHSTATE_CORE_CLICKHOUSE_ERRORS_H_
