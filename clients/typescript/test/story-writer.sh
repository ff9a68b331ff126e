#!/usr/bin/env bash
# The psql writer of story.test.ts: a holder of a fence scope in shell, with
# no fence library at all. It gets its token with `fencectl acquire` and
# writes through fence's guards inside the databases, with psql and
# redis-cli, as docs/protocol.md ("Guards inside the database") shows.
#
#   story-writer.sh take VALUE        acquire SCOPE (waiting in line while
#                                     it is held), write VALUE, print the
#                                     token; STORY_DONE (if set) gets the
#                                     exit status when it ends
#   story-writer.sh hold VALUE LATE   acquire SCOPE (waiting in line), write
#                                     VALUE, print "wrote TOKEN", then pause
#                                     until a line arrives on stdin (nothing
#                                     renews the lease meanwhile) and write
#                                     LATE with the same, old token
#
# Environment: FENCECTL (the binary), FENCE_ADDR (fenced), FENCE_TEST_POSTGRES,
# FENCE_TEST_REDIS, STORY_SCOPE, STORY_TABLE (a table (id int, value text)
# with a row id 1), STORY_TTL (the lease's TTL, e.g. 2s).
#
# A write updates the row through `SELECT fence_advance(...)` in the same
# transaction, and sets the key {SCOPE}:value through `FCALL fence_set`. Its
# exit status is 0 if both were accepted, plus 1 if PostgreSQL refused
# (psql's ERROR, SQLSTATE FN409, on stderr) and 2 if Redis refused (its
# STALE reply on stderr): 3 when both refused. redis-cli prints an error
# reply on stdout and exits 0, so its reply is checked here.
set -uo pipefail

: "${FENCECTL:?}" "${FENCE_ADDR:?}" "${FENCE_TEST_POSTGRES:?}" "${FENCE_TEST_REDIS:?}"
: "${STORY_SCOPE:?}" "${STORY_TABLE:?}" "${STORY_TTL:?}"
export FENCE_ADDR
S=$STORY_SCOPE

if [[ -n "${STORY_DONE:-}" ]]; then
	# Written at exit whatever happens, renamed into place in one step: the
	# paused holder polls for it.
	trap 'rc=$?; echo "$rc" >"$STORY_DONE.tmp"; mv "$STORY_DONE.tmp" "$STORY_DONE"' EXIT
fi

# acquire prints the token's value (a decimal integer) of a new lease on S,
# granted once S is free: fenced grants it only after the holder before
# expired (or released). Bounded at a minute.
acquire() {
	local out
	out=$("$FENCECTL" acquire "$S" --holder psql-writer --ttl "$STORY_TTL" --wait --timeout 60s -o json) || return
	# {"lease":{"scope":...,"token":"N",...}}: the API's AcquireResponse,
	# the token a JSON string of digits.
	sed -n 's/.*"token":"\([0-9][0-9]*\)".*/\1/p' <<<"$out"
}

# write TOKEN VALUE: the fenced writes, exit status as above.
write() {
	local token=$1 value=$2 rc=0 reply
	# No psql variables inside -c, so the values are put in by the shell:
	# the scope and table are the test's own names, the values plain words.
	psql "$FENCE_TEST_POSTGRES" -X -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -c \
		"BEGIN; SELECT fence_advance('$S', $token, 0); UPDATE $STORY_TABLE SET value = '$value' WHERE id = 1; COMMIT;" >/dev/null || rc=1
	reply=$(redis-cli -u "$FENCE_TEST_REDIS" FCALL fence_set 2 "fence:{$S}" "{$S}:value" "$token" 0 "$value") || return $((rc | 2))
	if [[ $reply != OK ]]; then
		echo "redis-cli: $reply" >&2
		rc=$((rc | 2))
	fi
	return $rc
}

case ${1:-} in
take)
	token=$(acquire) && [[ -n $token ]] || { echo "story-writer: acquire failed" >&2; exit 10; }
	write "$token" "$2" || exit
	echo "$token"
	;;
hold)
	token=$(acquire) && [[ -n $token ]] || { echo "story-writer: acquire failed" >&2; exit 10; }
	write "$token" "$2" || exit
	echo "wrote $token"
	# The pause: the lease is not renewed while this shell waits.
	read -r -t 120 _ || { echo "story-writer: never told to go on" >&2; exit 11; }
	write "$token" "$3"
	;;
*)
	echo "usage: story-writer.sh take VALUE | hold VALUE LATE" >&2
	exit 2
	;;
esac
