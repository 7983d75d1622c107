# Shared by ci/setup.sh and ci/engine.sh (sourced).
log() { echo "setup [$(date +%T)] $*" >&2; }

# apt_install PKG...: install the Debian packages that are not installed yet
apt_install() {
  local missing=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}
