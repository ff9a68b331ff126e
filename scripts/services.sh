#!/usr/bin/env bash
# Private PostgreSQL, MariaDB, Redis and S3 (SeaweedFS) servers for fence's
# tests, the headless Chromium that the status page's tests drive, Node.js for the
# TypeScript client's and Debian's Python packages for the Python client's.
#
#   scripts/services.sh [start]   install what is missing, start, wait, print the DSNs
#   scripts/services.sh stop      stop the instances this state dir started
#   scripts/services.sh status    say whether each instance answers (exit 1 if one does not)
#
# Each server listens on 127.0.0.1 only, on a fixed non-default port, so it
# never collides with a system instance that installing a Debian package may
# have started on the default port. Data, logs and pid files live under
# ${FENCE_SERVICES_DIR:-<repo>/.services}. Every wait is bounded by
# FENCE_SERVICES_WAIT seconds (default 60). The connection strings that the
# tests read are in scripts/services.env; keep its ports in step with these.
#
# The ports are the same for every checkout on a machine, so a second
# checkout finds the first one's servers answering and uses them: its tests
# share their databases (each test makes tables and keys of its own). start
# and status say so, naming the data directory of the server that answers;
# to run a checkout's own, stop the others (scripts/services.sh stop, in the
# checkout that started them).
#
# The S3 server is SeaweedFS's weed, which Debian does not package: the
# first start builds it from the Go module proxy (8 minutes on 2 idle
# cores, 23 on 2 busy ones; at the lowest CPU priority) into
# ${XDG_CACHE_HOME:-~/.cache}/fence/seaweedfs-<version>/weed, which every
# later start, and every checkout on the machine, reuses. FENCE_WEED names a
# weed binary to use instead.
set -euo pipefail

readonly HOST=127.0.0.1
readonly PG_PORT=54329
readonly MY_PORT=33069
readonly REDIS_PORT=63799
# SeaweedFS: the S3 gateway, and the master, volume and filer servers
# behind it, each with its gRPC port beside it (weed's default is +10000).
readonly S3_PORT=18339
readonly WEED_MASTER_PORT=19339
readonly WEED_VOLUME_PORT=18089
readonly WEED_FILER_PORT=18889
# The pseudo-version that was checked to answer a stale If-Match and an
# If-None-Match: * on an existing key with 412, as guard/s3guard needs.
readonly SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6
# The S3 credentials and bucket of the tests (FENCE_TEST_S3 in services.env).
readonly S3_ACCESS_KEY=fence S3_SECRET_KEY=fence-secret S3_BUCKET=fence-test
# Building weed takes minutes; its bound is separate from WAIT_SECS.
readonly BUILD_SECS=${FENCE_SERVICES_BUILD_WAIT:-3600}
readonly WAIT_SECS=${FENCE_SERVICES_WAIT:-60}
# A server that dies right after being launched is relaunched at most this
# often within WAIT_SECS: e.g. PostgreSQL refuses to start while children of a
# kill -9'd postmaster still hold its shared memory, and they exit on their own.
readonly MAX_LAUNCHES=5
# fd 9 holds the state dir's lock (see lock_state). Every daemon and installer
# we start gets 9>&-, or it would keep the lock and block the next run.

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
ENV_FILE=$SCRIPT_DIR/services.env
MY_UID=$(id -u)
STATE_DIR=''
# Set by resolve_binaries.
PG_BIN='' MY_SERVER='' MY_INSTALL_DB='' MY_CLIENT='' MY_ADMIN='' REDIS_SERVER='' REDIS_CLI='' CURL=''
# Set by ensure_weed.
WEED=''
MISSING=()
# Set by the *_layout functions.
PG_ROOT='' PG_DATA='' PG_LOG=''
MY_ROOT='' MY_DATA='' MY_LOG='' MY_PID='' MY_SOCK='' MY_INIT_SQL=''
REDIS_ROOT='' REDIS_LOG='' REDIS_PID=''
S3_ROOT='' S3_LOG='' S3_PID='' S3_CONF=''
# PID of the daemon a launch function started in the background, if it knows it.
LAUNCHED_PID=''

log() { printf 'services: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}
is_root() { [[ $MY_UID -eq 0 ]]; }

# ---------------------------------------------------------------- helpers

# find_bin NAME...: path of the first NAME found. Looks beyond PATH because a
# normal user's PATH lacks /usr/sbin, where Debian puts mariadbd.
find_bin() {
	local name dir
	local -a dirs
	IFS=: read -ra dirs <<<"$PATH"
	dirs+=(/usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin)
	for name in "$@"; do
		for dir in "${dirs[@]}"; do
			if [[ -n $dir && -f $dir/$name && -x $dir/$name ]]; then
				printf '%s\n' "$dir/$name"
				return 0
			fi
		done
	done
	return 1
}

# find_pg_bindir: directory holding initdb, pg_ctl and postgres. Debian keeps
# them out of PATH under /usr/lib/postgresql/<major>/bin; take the newest major.
find_pg_bindir() {
	local dir best=''
	while IFS= read -r dir; do
		[[ -x $dir/postgres && -x $dir/initdb && -x $dir/pg_ctl ]] && best=$dir
	done < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V)
	if [[ -z $best ]] && command -v pg_config >/dev/null 2>&1; then
		dir=$(pg_config --bindir 2>/dev/null || true)
		[[ -n $dir && -x $dir/postgres && -x $dir/initdb && -x $dir/pg_ctl ]] && best=$dir
	fi
	if [[ -z $best ]] && dir=$(find_bin initdb); then
		dir=$(dirname "$dir")
		[[ -x $dir/postgres && -x $dir/pg_ctl ]] && best=$dir
	fi
	[[ -n $best ]] && printf '%s\n' "$best"
}

# wait_until SECONDS CMD...: true once CMD succeeds, false if it never does in time.
wait_until() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@"; do
		((SECONDS < deadline)) || return 1
		sleep 0.5
	done
}

# proc_running PID COMM...: true when PID is a live (not zombie) process named
# COMM. Checking the name matters: after a reboot or in a fresh container a
# stale pid is often reused by an unrelated process. Checking for zombies
# matters where PID 1 does not reap orphans (containers): a kill -9'd server
# then stays in the process table, and kill -0 still succeeds on it.
proc_running() {
	local pid=$1 comm stat name
	shift
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
	stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
	stat=${stat##*) } # the state letter follows the last ')', as comm may hold any character
	[[ ${stat:0:1} != [ZX] ]] || return 1
	for name in "$@"; do
		[[ $comm == "$name" ]] && return 0
	done
	return 1
}

# pid_alive PIDFILE COMM...: true when PIDFILE's first line is a running COMM.
pid_alive() {
	local file=$1 pid
	shift
	pid=$(head -n 1 "$file" 2>/dev/null) || return 1
	proc_running "$pid" "$@"
}

# launched_alive COMM...: true while the process the last launch started runs.
launched_alive() {
	[[ -n $LAUNCHED_PID ]] && proc_running "$LAUNCHED_PID" "$@"
}

show_log() {
	if [[ -s $1 ]]; then
		log "last lines of $1:"
		tail -n 40 "$1" | sed 's/^/    /' >&2
	else
		log "(no log at $1)"
	fi
}

# private_tmp_dir: /tmp/fence-services-<uid>, for paths the state dir cannot
# host. Refuses a directory that someone else planted there.
private_tmp_dir() {
	local dir=/tmp/fence-services-$MY_UID
	[[ -e $dir || -L $dir ]] || mkdir -m 755 "$dir"
	[[ -d $dir && ! -L $dir && -O $dir ]] || die "$dir is not a directory owned by $(id -un)"
	printf '%s\n' "$dir"
}

# ensure_up NAME PING PIDFILE COMM LAUNCH LOG: start a server unless PING
# already succeeds, and wait until it does. A server process that exists but
# does not answer yet (crash recovery) is waited for, not started twice.
ensure_up() {
	local name=$1 ping=$2 pidfile=$3 comm=$4 launch=$5 logfile=$6
	local deadline=$((SECONDS + WAIT_SECS)) last=-100 launches=0
	if "$ping"; then
		log "$name: already running$(foreign_note "$name")"
		return 0
	fi
	LAUNCHED_PID=
	until "$ping"; do
		if ((SECONDS >= deadline)); then
			show_log "$logfile"
			die "$name did not answer within ${WAIT_SECS}s (log: $logfile)"
		fi
		if ! pid_alive "$pidfile" "$comm" && ! launched_alive "$comm" &&
			((SECONDS - last >= 3 && launches < MAX_LAUNCHES)); then
			# Nothing of ours runs: any pid file left is stale (killed server, reboot).
			rm -f "$pidfile"
			"$launch"
			last=$SECONDS
			launches=$((launches + 1))
		fi
		sleep 0.5
	done
	# Another checkout may have started its server on the port meanwhile.
	local dir
	if dir=$(foreign_dir "$name") && [[ $dir != "?" ]]; then
		log "$name: answering$(foreign_note "$name")"
	fi
}

# stop_pidfile NAME PIDFILE COMM: SIGTERM the server in PIDFILE, wait, then SIGKILL.
stop_pidfile() {
	local name=$1 pidfile=$2 comm=$3 pid
	if ! pid_alive "$pidfile" "$comm"; then
		log "$name: not running"
		return 0
	fi
	pid=$(head -n 1 "$pidfile")
	log "$name: stopping pid $pid"
	kill -TERM "$pid" 2>/dev/null || true
	if ! wait_until "$WAIT_SECS" not_running "$pid" "$comm"; then
		log "$name: still running after ${WAIT_SECS}s, killing it"
		kill -KILL "$pid" 2>/dev/null || true
		wait_until 10 not_running "$pid" "$comm" || die "$name (pid $pid) survived SIGKILL"
	fi
}
not_running() { ! proc_running "$@"; }

# same_dir A B: A and B name the same directory (trailing slashes, symlinks).
same_dir() {
	[[ -n $1 && -n $2 ]] && [[ "$(readlink -f -- "$1")" == "$(readlink -f -- "$2")" ]]
}

# served_dir NAME: where the server answering on NAME's port keeps its data,
# as it says itself; empty if it does not say.
served_dir() {
	case $1 in
	postgres) pg_psql -tA "$(pg_dsn postgres)" -c 'show data_directory' 2>/dev/null || true ;;
	mariadb)
		MYSQL_PWD=fence timeout 30 "$MY_CLIENT" --no-defaults --protocol=tcp -h "$HOST" -P "$MY_PORT" \
			-u fence --connect-timeout=5 -N -B -e 'SELECT @@datadir' </dev/null 2>/dev/null || true
		;;
	redis) timeout 10 "$REDIS_CLI" -h "$HOST" -p "$REDIS_PORT" config get dir </dev/null 2>/dev/null | sed -n 2p || true ;;
	s3)
		# The volume server's status names its data directories.
		timeout 10 "$CURL" -sf "http://$HOST:$WEED_VOLUME_PORT/status" </dev/null 2>/dev/null |
			grep -o '"dir":"[^"]*"' | head -n 1 | cut -d'"' -f4 || true
		;;
	esac
}

# foreign_dir NAME: true, printing the data directory the server on NAME's
# port names ("?" when it names none), if that is not this state dir's.
# Checkouts share the ports: without this a second checkout would use the
# first one's servers without a word.
foreign_dir() {
	local want dir
	case $1 in
	postgres) want=$PG_DATA ;;
	mariadb) want=$MY_DATA ;;
	redis) want=$REDIS_ROOT ;;
	s3) want=$S3_ROOT/data ;;
	esac
	dir=$(served_dir "$1")
	same_dir "$dir" "$want" && return 1
	printf '%s\n' "${dir:-?}"
}

# foreign_note NAME: for the log of a server found running, a sentence on
# whose it is, if not this checkout's.
foreign_note() {
	local dir
	dir=$(foreign_dir "$1") || return 0
	if [[ $dir == "?" ]]; then
		printf ', but it does not say where its data is: it may be another checkout'"'"'s, or not ours at all'
	else
		printf ', but not from this checkout: its data is in %s. This checkout'"'"'s tests will use it and share its databases; to run servers of its own, stop that one (scripts/services.sh stop, in the checkout that started it)' "$dir"
	fi
}

lock_state() {
	exec 9>"$STATE_DIR/.lock"
	flock -w $((WAIT_SECS * 5)) 9 || die "another services.sh still holds $STATE_DIR/.lock"
}

# ---------------------------------------------------------------- packages

# resolve_binaries: find every program we run; MISSING lists the Debian
# packages that would provide the ones not found.
resolve_binaries() {
	MISSING=()
	PG_BIN=$(find_pg_bindir || true)
	if [[ -z $PG_BIN || ! -x $PG_BIN/psql || ! -x $PG_BIN/pg_isready ]]; then
		MISSING+=(postgresql)
	fi
	MY_SERVER=$(find_bin mariadbd mysqld || true)
	MY_INSTALL_DB=$(find_bin mariadb-install-db mysql_install_db || true)
	MY_CLIENT=$(find_bin mariadb mysql || true)
	MY_ADMIN=$(find_bin mariadb-admin mysqladmin || true)
	if [[ -z $MY_SERVER || -z $MY_INSTALL_DB || -z $MY_CLIENT || -z $MY_ADMIN ]]; then
		MISSING+=(mariadb-server)
	fi
	REDIS_SERVER=$(find_bin redis-server || true)
	REDIS_CLI=$(find_bin redis-cli || true)
	if [[ -z $REDIS_SERVER || -z $REDIS_CLI ]]; then
		MISSING+=(redis-server)
	fi
	# curl asks the S3 server if it is up, and makes its bucket
	# (--aws-sigv4 signs the requests).
	CURL=$(find_bin curl || true)
	if [[ -z $CURL ]]; then
		MISSING+=(curl)
	fi
	# Not a service: the headless browser the status page's tests drive.
	if ! find_bin chromium >/dev/null; then
		MISSING+=(chromium)
	fi
	# Not a service either: Node and npm build and test the TypeScript
	# client (make test-ts).
	if ! find_bin node >/dev/null || ! find_bin npm >/dev/null; then
		MISSING+=(nodejs npm)
	fi
	# Nor these: Debian's python3 and the packages the Python client's
	# tests import (make test-py), for Debian's own interpreter, which a
	# python3 earlier on PATH (pyenv, a venv) may not be.
	local mod
	# (No setuptools or wheel: the client's build backend needs neither.)
	local -A pkg_of=([venv]=python3-venv [cryptography]=python3-cryptography [psycopg2]=python3-psycopg2 [pymysql]=python3-pymysql [redis]=python3-redis)
	if [[ ! -x /usr/bin/python3 ]]; then
		MISSING+=(python3)
	fi
	for mod in venv cryptography psycopg2 pymysql redis; do
		if [[ ! -x /usr/bin/python3 ]] || ! /usr/bin/python3 -c "import $mod" 2>/dev/null; then
			MISSING+=("${pkg_of[$mod]}")
		fi
	done
}

ensure_packages() {
	local -a priv=()
	resolve_binaries
	((${#MISSING[@]} == 0)) && return 0
	if is_root; then
		priv=()
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		priv=(sudo -n)
	else
		die "missing Debian packages: ${MISSING[*]}. Install them as root, then run this again:
    apt-get update && apt-get install -y --no-install-recommends ${MISSING[*]}"
	fi
	log "installing ${MISSING[*]} with apt-get"
	# Bounded: the lock timeout covers a concurrent apt/dpkg, the outer timeout a
	# stuck download. apt's output goes to stderr so stdout stays the summary.
	# A failed update (say, one unreachable extra source) need not doom the
	# install: the lists it did fetch may suffice, and install says if not.
	timeout 600 "${priv[@]}" apt-get -q update >&2 9>&- ||
		log "apt-get update failed; trying the install anyway"
	timeout 1200 "${priv[@]}" env DEBIAN_FRONTEND=noninteractive \
		apt-get -q -y -o DPkg::Lock::Timeout=120 install --no-install-recommends "${MISSING[@]}" \
		</dev/null >&2 9>&- ||
		die "apt-get install ${MISSING[*]} failed"
	resolve_binaries
	((${#MISSING[@]} == 0)) || die "still missing after install: ${MISSING[*]}"
}

# ---------------------------------------------------------------- PostgreSQL

# as_pg CMD...: PostgreSQL refuses to run as root, so root runs its programs
# as the postgres system user (from / so it can always read its cwd).
as_pg() {
	if is_root; then
		(cd / && exec runuser -u postgres -- "$@")
	else
		"$@"
	fi
}

# pg_layout: choose PG_ROOT, a directory the server's user owns. As root that
# is <state>/postgres chowned to postgres, unless postgres cannot reach it
# (e.g. the repo is under a 700 directory such as /root): then it is
# /tmp/fence-services-0/postgres.
pg_layout() {
	local dir=$STATE_DIR/postgres
	if is_root; then
		id -u postgres >/dev/null 2>&1 || die "no postgres system user (is the postgresql package installed?)"
		mkdir -p "$dir"
		chown postgres:postgres "$dir"
		chmod 700 "$dir"
		if ! as_pg test -w "$dir" || ! as_pg test -x "$dir"; then
			rmdir "$dir" 2>/dev/null || true
			dir=$(private_tmp_dir)/postgres
			log "postgres: the postgres user cannot reach $STATE_DIR; its data goes to $dir"
			mkdir -p "$dir"
			chown postgres:postgres "$dir"
			chmod 700 "$dir"
			as_pg test -w "$dir" || die "the postgres user cannot write $dir"
		fi
	else
		mkdir -p "$dir"
	fi
	PG_ROOT=$dir
	PG_DATA=$dir/data
	PG_LOG=$dir/postgres.log
}

pg_dsn() { printf 'postgres://fence:fence@%s:%s/%s?sslmode=disable' "$HOST" "$PG_PORT" "${1:-fence}"; }
pg_ping() { timeout 10 "$PG_BIN/pg_isready" -q -h "$HOST" -p "$PG_PORT" -t 3 </dev/null; }
pg_major() { "$PG_BIN/postgres" --version | sed -E 's/^[^0-9]*([0-9]+).*/\1/'; }
pg_psql() { timeout 30 "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$@" </dev/null; }

# pg_initialized: a complete data dir of this major version exists. The
# marker is written last, so an interrupted init is redone.
pg_initialized() {
	[[ -f $PG_DATA/.fence-initialized && "$(cat "$PG_DATA/PG_VERSION" 2>/dev/null)" == "$(pg_major)" ]]
}

pg_init() {
	local pwfile=$PG_ROOT/.pwfile
	log "postgres: initializing $PG_DATA (PostgreSQL $(pg_major))"
	rm -rf "$PG_DATA"
	# The bootstrap superuser is fence itself, with password fence: tests may
	# do anything, and no admin credential needs keeping.
	printf 'fence\n' >"$pwfile"
	chmod 600 "$pwfile"
	is_root && chown postgres:postgres "$pwfile"
	if ! as_pg "$PG_BIN/initdb" -D "$PG_DATA" -U fence --pwfile="$pwfile" \
		--auth-local=scram-sha-256 --auth-host=scram-sha-256 \
		--encoding=UTF8 --no-locale >"$PG_ROOT/initdb.log" 2>&1 </dev/null; then
		rm -f "$pwfile"
		show_log "$PG_ROOT/initdb.log"
		die "postgres: initdb failed"
	fi
	rm -f "$pwfile"
	# initdb's pg_hba.conf already asks for scram-sha-256 from 127.0.0.1/32.
	cat >>"$PG_DATA/postgresql.conf" <<EOF

# Added by fence's scripts/services.sh: a private instance for tests.
listen_addresses = '$HOST'
port = $PG_PORT
# No Unix socket: everything goes over TCP, and a long state path could not hold one.
unix_socket_directories = ''
max_connections = 200
# Test data only: without fsync a killed server loses nothing; only an OS crash could.
fsync = off
EOF
	as_pg touch "$PG_DATA/.fence-initialized"
}

pg_launch() {
	pg_initialized || pg_init
	log "postgres: starting on $HOST:$PG_PORT"
	# -W: don't wait here; ensure_up polls, and relaunches if this start fails.
	as_pg "$PG_BIN/pg_ctl" start -W -s -D "$PG_DATA" -l "$PG_LOG" </dev/null >/dev/null 9>&- ||
		log "postgres: pg_ctl start failed (will retry while time remains)"
}

# pg_ensure_db: the role exists from initdb; create the database if missing.
pg_ensure_db() {
	local have
	have=$(pg_psql -tA "$(pg_dsn postgres)" -c "select 1 from pg_database where datname = 'fence'") ||
		die "postgres answers on $HOST:$PG_PORT but fence/fence cannot log in (another server on that port?)"
	if [[ $have != 1 ]]; then
		log "postgres: creating database fence"
		pg_psql "$(pg_dsn postgres)" -c 'create database fence owner fence' || die "postgres: create database failed"
	fi
}

start_postgres() {
	pg_layout
	ensure_up postgres pg_ping "$PG_DATA/postmaster.pid" postgres pg_launch "$PG_LOG"
	pg_ensure_db
	printf '%-9s ready  %s\n' postgres "postgres://fence:fence@$HOST:$PG_PORT/fence"
}

stop_postgres() {
	pg_layout
	if ! pid_alive "$PG_DATA/postmaster.pid" postgres; then
		log "postgres: not running"
		return 0
	fi
	log "postgres: stopping"
	as_pg "$PG_BIN/pg_ctl" stop -s -D "$PG_DATA" -m fast -w -t "$WAIT_SECS" </dev/null 9>&- ||
		as_pg "$PG_BIN/pg_ctl" stop -s -D "$PG_DATA" -m immediate -w -t "$WAIT_SECS" </dev/null 9>&- ||
		die "postgres: pg_ctl stop failed"
}

# ---------------------------------------------------------------- MariaDB

my_layout() {
	MY_ROOT=$STATE_DIR/mariadb
	MY_DATA=$MY_ROOT/data
	MY_LOG=$MY_ROOT/mariadb.log
	MY_PID=$MY_ROOT/mariadb.pid
	MY_INIT_SQL=$MY_ROOT/init.sql
	MY_SOCK=$MY_ROOT/mariadb.sock
	mkdir -p "$MY_ROOT"
	# A Unix socket path must fit in 108 bytes; mariadbd always opens one.
	if ((${#MY_SOCK} > 100)); then
		MY_SOCK=$(private_tmp_dir)/mariadb.sock
	fi
}

my_ping() {
	MYSQL_PWD=fence timeout 10 "$MY_ADMIN" --no-defaults --protocol=tcp -h "$HOST" -P "$MY_PORT" \
		-u fence --connect-timeout=3 ping </dev/null >/dev/null 2>&1
}

my_initialized() { [[ -f $MY_DATA/.fence-initialized ]]; }

my_init() {
	local -a args=(--no-defaults --datadir="$MY_DATA" --skip-test-db)
	# As root the server runs as root too (--user=root), so nothing needs
	# chowning and no path needs to be reachable by the mysql user.
	is_root && args+=(--user=root)
	log "mariadb: initializing $MY_DATA"
	rm -rf "$MY_DATA"
	mkdir -p "$MY_DATA"
	if ! "$MY_INSTALL_DB" "${args[@]}" >"$MY_ROOT/install-db.log" 2>&1 </dev/null 9>&-; then
		show_log "$MY_ROOT/install-db.log"
		die "mariadb: $(basename "$MY_INSTALL_DB") failed"
	fi
	touch "$MY_DATA/.fence-initialized"
}

# my_write_init_sql: run by the server at every start, before it accepts
# connections, so the fence account exists once a ping succeeds. It needs no
# admin login, which differs between root (unix_socket auth) and other users.
my_write_init_sql() {
	local h
	: >"$MY_INIT_SQL"
	chmod 600 "$MY_INIT_SQL"
	echo "CREATE DATABASE IF NOT EXISTS fence CHARACTER SET utf8mb4;" >>"$MY_INIT_SQL"
	for h in 127.0.0.1 localhost; do
		cat >>"$MY_INIT_SQL" <<EOF
CREATE USER IF NOT EXISTS 'fence'@'$h' IDENTIFIED BY 'fence';
ALTER USER 'fence'@'$h' IDENTIFIED BY 'fence';
GRANT ALL PRIVILEGES ON *.* TO 'fence'@'$h' WITH GRANT OPTION;
EOF
	done
}

my_launch() {
	local -a args=(
		--no-defaults # ignore /etc/mysql: it names the system instance's port, socket and datadir
		--datadir="$MY_DATA" --bind-address="$HOST" --port="$MY_PORT"
		--socket="$MY_SOCK" --pid-file="$MY_PID" --log-error="$MY_LOG"
		--init-file="$MY_INIT_SQL"
		--skip-name-resolve # fence@127.0.0.1 matches TCP clients; no DNS lookups
		--character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci
		--max-connections=500
		--innodb-flush-log-at-trx-commit=2 # test data: a killed server still loses nothing
	)
	is_root && args+=(--user=root)
	my_initialized || my_init
	my_write_init_sql
	log "mariadb: starting on $HOST:$MY_PORT"
	# setsid: a new session, so a Ctrl-C in the calling terminal leaves it
	# running. As a background job of a script it is no group leader, so setsid
	# execs in place and $! is mariadbd's own pid.
	setsid "$MY_SERVER" "${args[@]}" </dev/null >>"$MY_LOG" 2>&1 9>&- &
	LAUNCHED_PID=$!
}

my_check_login() {
	MYSQL_PWD=fence timeout 30 "$MY_CLIENT" --no-defaults --protocol=tcp -h "$HOST" -P "$MY_PORT" \
		-u fence --connect-timeout=5 -N -B -e 'SELECT 1' fence </dev/null >/dev/null
}

start_mariadb() {
	my_layout
	ensure_up mariadb my_ping "$MY_PID" mariadbd my_launch "$MY_LOG"
	my_check_login || die "mariadb answers on $HOST:$MY_PORT but fence/fence cannot use database fence (another server on that port?)"
	printf '%-9s ready  %s\n' mariadb "fence:fence@tcp($HOST:$MY_PORT)/fence"
}

# ---------------------------------------------------------------- Redis

redis_layout() {
	REDIS_ROOT=$STATE_DIR/redis
	REDIS_LOG=$REDIS_ROOT/redis.log
	REDIS_PID=$REDIS_ROOT/redis.pid
	mkdir -p "$REDIS_ROOT"
}

redis_ping() {
	[[ $(timeout 10 "$REDIS_CLI" -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null </dev/null) == PONG ]]
}

redis_launch() {
	log "redis: starting on $HOST:$REDIS_PORT"
	# No persistence by default: tests that need it configure it themselves.
	# Its stdout (errors before it opens its log) goes to the same log.
	# shellcheck disable=SC2094
	"$REDIS_SERVER" --port "$REDIS_PORT" --bind "$HOST" --daemonize yes \
		--dir "$REDIS_ROOT" --pidfile "$REDIS_PID" --logfile "$REDIS_LOG" \
		--save '' --appendonly no </dev/null >>"$REDIS_LOG" 2>&1 9>&- ||
		log "redis: redis-server failed to start (will retry while time remains)"
}

start_redis() {
	redis_layout
	ensure_up redis redis_ping "$REDIS_PID" redis-server redis_launch "$REDIS_LOG"
	printf '%-9s ready  %s\n' redis "redis://$HOST:$REDIS_PORT/0"
}

# ---------------------------------------------------------------- S3 (SeaweedFS)

# ensure_weed: set WEED to a weed binary, building SeaweedFS once if the
# cache has none. A lock on the cache directory makes a second checkout
# wait for the first one's build instead of building too.
ensure_weed() {
	if [[ -n ${FENCE_WEED:-} ]]; then
		[[ -f $FENCE_WEED && -x $FENCE_WEED ]] || die "FENCE_WEED=$FENCE_WEED is not an executable file"
		WEED=$FENCE_WEED
		return 0
	fi
	local cache=${XDG_CACHE_HOME:-$HOME/.cache}/fence/seaweedfs-$SEAWEEDFS_VERSION
	WEED=$cache/weed
	[[ -x $WEED ]] && return 0
	command -v go >/dev/null 2>&1 ||
		die "building SeaweedFS's weed (once) needs Go on PATH; or set FENCE_WEED to a weed binary"
	mkdir -p "$cache"
	(
		flock -w "$BUILD_SECS" 8 || die "another build of weed still holds $cache/.lock"
		[[ -x $WEED ]] && exit 0 # built by whoever held the lock
		build_weed "$cache"
	) 8>"$cache/.lock"
	[[ -x $WEED ]] || die "no weed at $WEED after the build"
}

# build_weed DIR: build weed into DIR/weed, in a throwaway module. go
# install ...@version refuses SeaweedFS, whose go.mod has a replace
# directive; a replace applies only in the main module, so this one repeats
# it. Lowest CPU priority, since the machine may be shared; but all cores,
# since under make test nothing else runs until services are up.
build_weed() {
	local cache=$1 mod
	mod=$(mktemp -d "$cache/build.XXXXXX")
	cat >"$mod/go.mod" <<EOF
module fence.local/weedbuild

go 1.26

require github.com/seaweedfs/seaweedfs $SEAWEEDFS_VERSION

replace github.com/tyler-smith/go-bip39 => github.com/cosmos/go-bip39 v1.0.0
EOF
	log "s3: building SeaweedFS's weed $SEAWEEDFS_VERSION from the Go module proxy, once for this machine (8 to 25 minutes on 2 cores; log: $mod/build.log)"
	if ! (cd "$mod" && export GOWORK=off &&
		timeout "$BUILD_SECS" nice -n 19 go get github.com/seaweedfs/seaweedfs/weed@"$SEAWEEDFS_VERSION" &&
		timeout "$BUILD_SECS" nice -n 19 go build -trimpath -ldflags='-s -w' -o "$mod/weed" github.com/seaweedfs/seaweedfs/weed
	) </dev/null >"$mod/build.log" 2>&1 9>&- 8>&-; then
		show_log "$mod/build.log"
		die "s3: building weed failed (log: $mod/build.log)"
	fi
	mv -f "$mod/weed" "$cache/weed" # a rename: no one runs a half-written binary
	rm -rf "$mod"
	log "s3: weed is in $cache/weed"
}

s3_layout() {
	S3_ROOT=$STATE_DIR/seaweedfs
	S3_LOG=$S3_ROOT/weed.log
	S3_PID=$S3_ROOT/weed.pid
	S3_CONF=$S3_ROOT/s3.json
	mkdir -p "$S3_ROOT/data"
}

s3_ping() { timeout 10 "$CURL" -sf -o /dev/null "http://$HOST:$S3_PORT/healthz" </dev/null 2>/dev/null; }

# s3_request METHOD PATH [BODY]: a request signed with the tests'
# credentials; it prints the HTTP status.
s3_request() {
	local body=${3:-} hash
	# S3 wants the body's hash in a header, which curl (7.88) leaves out.
	hash=$(printf '%s' "$body" | sha256sum | cut -d' ' -f1)
	timeout 30 "$CURL" -s -o /dev/null -w '%{http_code}' -X "$1" --aws-sigv4 'aws:amz:us-east-1:s3' \
		--user "$S3_ACCESS_KEY:$S3_SECRET_KEY" -H "x-amz-content-sha256: $hash" \
		-H 'Content-Type: text/plain' --data-binary "$body" \
		"http://$HOST:$S3_PORT$2" </dev/null 2>/dev/null || true
}

# s3_ready: the bucket exists and takes a write. The first write to a new
# bucket waits for the master to grow volumes for it.
s3_ready() {
	case $(s3_request PUT "/$S3_BUCKET") in
	200 | 409) ;; # 409: the bucket exists already
	*) return 1 ;;
	esac
	[[ $(s3_request PUT "/$S3_BUCKET/services-probe" ok) == 200 ]]
}

s3_launch() {
	local sockets=$S3_ROOT
	# A Unix socket path must fit in 108 bytes.
	if ((${#sockets} > 90)); then
		sockets=$(private_tmp_dir)
	fi
	# One identity, the tests': requests without its signature are refused.
	cat >"$S3_CONF" <<EOF
{"identities": [{"name": "fence", "credentials": [{"accessKey": "$S3_ACCESS_KEY", "secretKey": "$S3_SECRET_KEY"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
EOF
	local -a args=(
		server -ip="$HOST" -ip.bind="$HOST" -dir="$S3_ROOT/data"
		-master.port="$WEED_MASTER_PORT" -master.port.grpc=$((WEED_MASTER_PORT + 1))
		-master.telemetry=false # it would report to telemetry.seaweedfs.com
		-master.volumeSizeLimitMB=64 -volume.max=0
		-volume.port="$WEED_VOLUME_PORT" -volume.port.grpc=$((WEED_VOLUME_PORT + 1))
		-filer -filer.port="$WEED_FILER_PORT" -filer.port.grpc=$((WEED_FILER_PORT + 1))
		-filer.localSocket="$sockets/weed-filer.sock"
		-s3 -s3.port="$S3_PORT" -s3.port.grpc=$((S3_PORT + 1)) -s3.config="$S3_CONF"
		-s3.localSocket="$sockets/weed-s3.sock"
		-s3.port.iceberg=0 -s3.port.lance=0 # catalogs the tests do not use, on ports of their own
	)
	log "s3: starting SeaweedFS on $HOST:$S3_PORT"
	# setsid: as for mariadbd, $! is weed's own pid.
	setsid "$WEED" "${args[@]}" </dev/null >>"$S3_LOG" 2>&1 9>&- &
	LAUNCHED_PID=$!
	echo "$LAUNCHED_PID" >"$S3_PID"
}

start_s3() {
	ensure_weed
	s3_layout
	ensure_up s3 s3_ping "$S3_PID" weed s3_launch "$S3_LOG"
	if ! wait_until "$WAIT_SECS" s3_ready; then
		show_log "$S3_LOG"
		die "s3 answers on $HOST:$S3_PORT but bucket $S3_BUCKET cannot be made or written with the tests' credentials (another server on that port?)"
	fi
	printf '%-9s ready  %s\n' s3 "http://$S3_ACCESS_KEY:$S3_SECRET_KEY@$HOST:$S3_PORT/$S3_BUCKET"
}

# ---------------------------------------------------------------- commands

cmd_start() {
	ensure_packages
	start_postgres
	start_mariadb
	start_redis
	start_s3
	echo "# connection strings, from $ENV_FILE:"
	grep -E '^[A-Z0-9_]+=' "$ENV_FILE"
}

cmd_stop() {
	resolve_binaries
	if [[ -n $PG_BIN ]]; then stop_postgres; fi
	my_layout
	stop_pidfile mariadb "$MY_PID" mariadbd
	redis_layout
	stop_pidfile redis "$REDIS_PID" redis-server
	s3_layout
	stop_pidfile s3 "$S3_PID" weed
	# What still answers was not started from this state dir.
	local dir
	if [[ -n $PG_BIN ]] && pg_ping && dir=$(foreign_dir postgres); then
		log "postgres: the server on $HOST:$PG_PORT is another checkout's (data in $dir); left running"
	fi
	if [[ -n $MY_ADMIN ]] && my_ping && dir=$(foreign_dir mariadb); then
		log "mariadb: the server on $HOST:$MY_PORT is another checkout's (data in $dir); left running"
	fi
	if [[ -n $REDIS_CLI ]] && redis_ping && dir=$(foreign_dir redis); then
		log "redis: the server on $HOST:$REDIS_PORT is another checkout's (data in $dir); left running"
	fi
	if [[ -n $CURL ]] && s3_ping && dir=$(foreign_dir s3); then
		log "s3: the server on $HOST:$S3_PORT is another checkout's (data in $dir); left running"
	fi
}

cmd_status() {
	local down=0
	resolve_binaries
	if [[ -n $PG_BIN ]]; then pg_layout; fi
	my_layout
	redis_layout
	s3_layout
	status_line postgres "postgres://fence:fence@$HOST:$PG_PORT/fence" "$PG_BIN" pg_ping || down=1
	status_line mariadb "fence:fence@tcp($HOST:$MY_PORT)/fence" "$MY_ADMIN" my_ping || down=1
	status_line redis "redis://$HOST:$REDIS_PORT/0" "$REDIS_CLI" redis_ping || down=1
	status_line s3 "http://$HOST:$S3_PORT/$S3_BUCKET" "$CURL" s3_ping || down=1
	return "$down"
}

# status_line NAME DSN CLIENT PING: CLIENT empty means not installed.
status_line() {
	if [[ -z $3 ]]; then
		printf '%-9s %-5s  %s\n' "$1" down "(not installed)"
		return 1
	elif "$4"; then
		local dir note=''
		if dir=$(foreign_dir "$1"); then
			note="  (not this checkout's: data in $dir)"
		fi
		printf '%-9s %-5s  %s%s\n' "$1" up "$2" "$note"
	else
		printf '%-9s %-5s  %s\n' "$1" down "$2"
		return 1
	fi
}

main() {
	local cmd=${1:-start}
	case $cmd in
	start | stop | status) ;;
	-h | --help | help)
		sed -n '2,/^set -euo/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
		return 0
		;;
	*)
		echo "usage: $0 [start|stop|status]" >&2
		return 2
		;;
	esac
	STATE_DIR=${FENCE_SERVICES_DIR:-$REPO_DIR/.services}
	# 755: the postgres user must be able to traverse it when we run as root.
	if [[ ! -d $STATE_DIR ]]; then
		mkdir -p "$STATE_DIR"
		chmod 755 "$STATE_DIR"
	fi
	STATE_DIR=$(cd "$STATE_DIR" && pwd)
	lock_state
	"cmd_$cmd"
}

main "$@"
