#!/usr/bin/env bash
# Ensure a Docker Engine >= 23 is running. Older engines refuse --privileged on
# hosts whose bounding set lacks some caps (23+ clamps caps to it, moby#42933).
# Bookworm ships 20.10, so take docker.io and containerd from trixie (dpkg -x
# into $PREFIX, apt state kept private under $CACHE) with bookworm's runc.
# Idempotent: a second run only checks.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
die() { log "ERROR: $*"; exit 1; }

PREFIX=/opt/kube-harness/engine
CACHE=/var/cache/kube-harness/engine
PIDFILE=/var/run/kube-harness-dockerd.pid
LOGFILE=/var/log/kube-harness-dockerd.log
# package=upstream major.minor that is known to run on bookworm (glibc 2.36)
PINS=(docker.io=26.1 containerd=1.7 tini=0.19 docker-cli=26.1)

server_version() { docker version --format '{{.Server.Version}}' 2>/dev/null; }
major() { local v="${1#*:}"; echo "${v%%.*}"; }

# 1. an engine already answers: keep it if >= 23; stop it only if we started it
check_running() {
  local v pid
  v=$(server_version) && [ -n "$v" ] || return 0
  if [ "$(major "$v")" -ge 23 ]; then
    log "docker $v storage=$(docker info --format '{{.Driver}}') cgroup=$(docker info --format '{{.CgroupVersion}}'): engine >= 23 already running, left alone"
    exit 0
  fi
  log "docker engine $v is older than 23 (cannot run --privileged node containers on this host)"
  pid=$(cat "$PIDFILE" 2>/dev/null || true)
  if [ -n "$pid" ] && [ "$pid" = "$(cat /var/run/docker.pid 2>/dev/null)" ] && kill -0 "$pid" 2>/dev/null; then
    log "stopping it (pid $pid, started earlier by ci/engine.sh)"
    kill -TERM "$pid"
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    ! kill -0 "$pid" 2>/dev/null || die "dockerd pid $pid did not stop"
    rm -f "$PIDFILE"
  else
    die "this engine was not started by ci/engine.sh; stop it (e.g. systemctl stop docker) or upgrade it to >= 23, then rerun"
  fi
}
check_running
# never start a second engine next to one that is still starting or hung
if pgrep -x dockerd >/dev/null; then
  log "a dockerd process exists but does not answer yet; waiting up to 60 s"
  for _ in $(seq 1 60); do server_version >/dev/null && break; sleep 1; done
  check_running
  ! pgrep -x dockerd >/dev/null || die "dockerd (pid $(pgrep -x dockerd | xargs)) does not answer; stop it and rerun"
fi

# 2. pick a dockerd >= 23: the one on PATH, else ours (installed on demand)
dockerd_major() { "$1" --version 2>/dev/null | sed -n 's/^Docker version \([0-9]*\)\..*/\1/p'; }
path=$PATH
if d=$(command -v dockerd) && [ "$(dockerd_major "$d")" -ge 23 ] 2>/dev/null; then
  log "using $d ($("$d" --version))"
else
  # trixie's runc needs glibc 2.38; bookworm's runc works with containerd 1.7
  apt_install runc iptables debian-archive-keyring
  pkgs=(docker.io containerd tini)
  command -v docker >/dev/null || pkgs+=(docker-cli)
  installed() { for p in "${pkgs[@]}"; do grep -qs "^$p " "$PREFIX/VERSIONS" || return 1; done; }
  if ! installed; then
    log "installing Docker engine from Debian trixie into $PREFIX (${pkgs[*]})"
    # private apt state: nothing under /etc/apt or /var/lib/apt is read or written
    mkdir -p "$CACHE/lists/partial" "$CACHE/apt/archives/partial" "$CACHE/debs" "$CACHE/empty"
    chown _apt "$CACHE/debs" 2>/dev/null || true  # apt downloads as _apt
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" >"$CACHE/sources.list"
    aptx() {
      "$@" -q -o Dir::Etc::SourceList="$CACHE/sources.list" -o Dir::Etc::SourceParts="$CACHE/empty" \
        -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts="$CACHE/empty" \
        -o Dir::State::Lists="$CACHE/lists" -o Dir::State::status=/dev/null \
        -o Dir::Cache="$CACHE/apt" -o APT::Get::List-Cleanup=0 -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
    }
    arch=$(dpkg --print-architecture)
    # sets debs (cached .debs of trixie's current versions) and missing (packages without one)
    find_debs() {
      local p v
      declare -A ver=()
      while read -r p v; do ver[$p]=$v; done < <(aptx apt-cache show --no-all-versions "${pkgs[@]}" 2>/dev/null |
        awk '/^Package:/{p=$2} /^Version:/{print p, $2}')
      debs=() missing=()
      for p in "${pkgs[@]}"; do
        v=${ver[$p]:-}
        if [ -n "$v" ] && [ -s "$CACHE/debs/${p}_${v/:/%3a}_$arch.deb" ]; then
          debs+=("$CACHE/debs/${p}_${v/:/%3a}_$arch.deb")
        else
          missing+=("$p")
        fi
      done
      [ ${#missing[@]} -eq 0 ]
    }
    if ! find_debs; then
      aptx apt-get update >/dev/null
      if ! find_debs; then
        log "downloading ${missing[*]} from trixie"
        (cd "$CACHE/debs" && aptx apt-get download "${missing[@]}" >/dev/null)
        find_debs || die "download of ${missing[*]} from trixie failed"
      fi
    fi
    rm -rf "$PREFIX.new" && mkdir -p "$PREFIX.new"
    for f in "${debs[@]}"; do
      p=$(dpkg-deb -f "$f" Package) v=$(dpkg-deb -f "$f" Version)
      for pin in "${PINS[@]}"; do
        [ "${pin%%=*}" != "$p" ] || [[ "${v#*:}" == "${pin#*=}".* ]] ||
          die "trixie's $p is now $v, ci/engine.sh pins ${pin#*=}.x; check it runs on this host (glibc) and update PINS"
      done
      dpkg -x "$f" "$PREFIX.new"
      echo "$p $v" >>"$PREFIX.new/VERSIONS"
    done
    rm -rf "$PREFIX" && mv "$PREFIX.new" "$PREFIX"
    log "installed: $(paste -sd, "$PREFIX/VERSIONS" | sed 's/,/, /g')"
  fi
  # no docker CLI on this machine: expose trixie's
  if ! command -v docker >/dev/null && [ -x "$PREFIX/usr/bin/docker" ] && [ ! -e /usr/local/bin/docker ]; then
    ln -s "$PREFIX/usr/bin/docker" /usr/local/bin/docker
  fi
  path="$PREFIX/usr/sbin:$PREFIX/usr/bin:$PATH"
  export PATH="$PATH:$PREFIX/usr/bin"
fi

# 3. start it
log "starting dockerd ($(PATH=$path command -v dockerd)), log $LOGFILE"
if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
  rm -f /var/run/docker.pid
fi
mkdir -p "$(dirname "$LOGFILE")"
PATH=$path setsid nohup dockerd >>"$LOGFILE" 2>&1 </dev/null &
echo $! >"$PIDFILE"
for _ in $(seq 1 60); do server_version >/dev/null && break; sleep 1; done
v=$(server_version) || { tail -50 "$LOGFILE" >&2; die "dockerd did not answer within 60 s (log $LOGFILE)"; }
[ "$(major "$v")" -ge 23 ] || die "started engine is $v, expected >= 23"
log "docker $v storage=$(docker info --format '{{.Driver}}') cgroup=$(docker info --format '{{.CgroupVersion}}')"
