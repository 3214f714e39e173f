# Shared by scripts/test and scripts/demo: install only what is missing, on a fresh Debian 12
# machine (as root, or with sudo) or on a developer's. Source it from the repository root.

readonly MOTO_REQUIREMENT='moto[server]==5.2.5'
readonly SQUAWK_REQUIREMENT='squawk-cli==2.70.0'
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

# Where initdb and postgres live; mirrors tests/support/pg.rs.
pg_bindir() {
	local dir
	for dir in "${OUTBOX_TEST_PG_BINDIR:-}" "$(pg_config --bindir 2>/dev/null || true)" \
		/usr/lib/postgresql/*/bin; do
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
	if [ ! -f .tools/node_modules/fauxqs/package.json ]; then
		step "npm ci --prefix .tools (fauxqs)"
		npm ci --prefix .tools --no-audit --no-fund
	fi
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

# A port nobody listens on right now, on loopback.
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
		node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'
}
