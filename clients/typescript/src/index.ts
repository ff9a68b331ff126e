// The TypeScript client and guards of fenced, the fence lease service.
// See README.md; docs/protocol.md in the repository is the contract.

export { Client, Lease, type AcquireOptions, type ClientOptions, type ScopeState } from "./client.js";
export { FenceError, HeldError, InvalidError, LostError, NotHolderError, StaleError, UnavailableError } from "./errors.js";
export { check, next, MemoryMarkStore, type Mark, type MarkStore, type Write } from "./guard.js";
export {
  fencedFetch,
  fencingMiddleware,
  staleFromProblem,
  PROBLEM_TYPE,
  SEQUENCE_HEADER,
  TOKEN_HEADER,
  type FencedFetchOptions,
  type Middleware,
  type MiddlewareOptions,
} from "./http.js";
export { KeySet, RemoteKeySet, type KeysFile, type Verifier } from "./keys.js";
export { formatToken, isSigned, MAX_TOKEN, parseToken, parseValue, signedPayload, validateScope, type Token } from "./token.js";
export { pgAdvance, pgFenced, pgMarkAdvancer, type PgOptions, type Queryable } from "./pg.js";
export type { Presented } from "./presented.js";
export { dataKey, markKey, redisDel, redisHset, redisIncrby, redisMarkAdvancer, redisSet, type RedisLike, type RedisWriteOptions } from "./redis.js";
export { MAX_REPORT, Reporter, type Rejection, type RejectionReporter, type ReporterOptions } from "./report.js";
export { Follower, markStoreAdvancer, type FollowerOptions, type MarkAdvancer } from "./follow.js";
export type { EventKind, WatchEvent, WatchOptions, WatchResponse } from "./watch.js";
