// pgAdvance and pgFenced with a schema: the guard's function is called by
// its qualified name, and a schema that is not a name fails before any
// query (issue 32, item 9). No database: a Queryable that records.

import assert from "node:assert/strict";
import { test } from "node:test";

import { InvalidError, pgAdvance, pgFenced, type Queryable } from "../src/index.js";

function recorder(): Queryable & { texts: string[] } {
  const texts: string[] = [];
  return {
    texts,
    async query(text: string) {
      texts.push(text);
      return {};
    },
  };
}

const token = "fence:v1:orders:42";

test("a schema qualifies the call to fence_advance", async () => {
  const db = recorder();
  await pgAdvance(db, token, undefined, { schema: "fence" });
  await pgFenced(db, token, async () => undefined, { schema: "fence_guard", seq: 3n });
  await pgAdvance(db, token);
  assert.deepEqual(db.texts, [
    'SELECT "fence".fence_advance($1::text, $2::bigint, $3::bigint)',
    "BEGIN",
    'SELECT "fence_guard".fence_advance($1::text, $2::bigint, $3::bigint)',
    "COMMIT",
    "SELECT fence_advance($1::text, $2::bigint, $3::bigint)",
  ]);
});

test("a schema that is not a name is refused before any query", async () => {
  for (const schema of ["", "fence.x", 'fence"; DROP TABLE fence_tokens; --', "1fence", "a".repeat(64), "fen ce"]) {
    const db = recorder();
    await assert.rejects(pgAdvance(db, token, undefined, { schema }), (err) => err instanceof InvalidError && /schema name/.test(err.message), `schema ${JSON.stringify(schema)}`);
    await assert.rejects(pgFenced(db, token, async () => undefined, { schema }), InvalidError, `schema ${JSON.stringify(schema)}`);
    assert.deepEqual(db.texts, [], `schema ${JSON.stringify(schema)}: queries sent`);
  }
});
