#!/bin/bash
# kube-harness node entrypoint: runs as PID 1 of a privileged node container,
# prepares the container so systemd, containerd and the kubelet behave as on
# a machine, then execs the init system given as arguments (/sbin/init).
#
# Modelled on the fix-ups of kind's base image entrypoint (the ideas, not the
# code): mounts, cgroup v1 without a cgroup namespace, machine identity,
# /dev/kmsg, iptables backend selection and Docker embedded DNS.
#
# State that must survive a container restart lives in /etc/kube-harness
# (container layer, per machine).
set -o errexit -o nounset -o pipefail

STATE=/etc/kube-harness
mkdir -p "$STATE"

info() { echo "INFO: $*" >&2; }
warn() { echo "WARN: $*" >&2; }

# grep that only fails on real errors, not on "no match"
grep_ok() { grep "$@" || [[ $? == 1 ]]; }

# has_cap N: whether capability number N is in our effective set. Where the
# engine cannot grant every capability (--privileged fails), the provider
# runs nodes with all capabilities it can grant instead; CAP_SYS_RESOURCE
# (24) is the one missing on some sandboxed hosts.
has_cap() {
  local eff
  eff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
  (( (16#$eff >> $1) & 1 ))
}

configure_proxy() {
  # hand proxy settings to every unit systemd starts
  if [[ -z "${HTTP_PROXY:-}${HTTPS_PROXY:-}${NO_PROXY:-}" ]]; then
    return
  fi
  mkdir -p /etc/systemd/system.conf.d
  cat >/etc/systemd/system.conf.d/10-proxy.conf <<EOF
[Manager]
DefaultEnvironment="HTTP_PROXY=${HTTP_PROXY:-}" "HTTPS_PROXY=${HTTPS_PROXY:-}" "NO_PROXY=${NO_PROXY:-}"
EOF
}

configure_containerd() {
  # containerd's overlayfs snapshotter needs /var/lib/containerd on a
  # filesystem that can be an overlay upper dir (not overlay itself, not zfs);
  # the provider mounts a volume on /var for that. Fall back to the native
  # snapshotter when an overlay mount there does not work.
  # (kind passes KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER for the same choice)
  local want=${KUBE_HARNESS_SNAPSHOTTER:-${KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER:-}}
  if [[ -z "$want" ]]; then
    local t
    t=$(mktemp -d /var/lib/kube-harness-overlay-test.XXXXXX 2>/dev/null || true)
    if [[ -n "$t" ]]; then
      mkdir -p "$t/l" "$t/u" "$t/w" "$t/m"
      if mount -t overlay overlay -o "lowerdir=$t/l,upperdir=$t/u,workdir=$t/w" "$t/m" 2>/dev/null; then
        umount "$t/m"
      else
        want=native
        warn "overlayfs does not work on /var ($(stat -f -c %T /var)); containerd uses the native snapshotter"
      fi
      rm -rf "$t"
    fi
  fi
  if ! has_cap 24 && [[ -f /etc/containerd/config.toml ]]; then
    # without CAP_SYS_RESOURCE nobody may lower an oom_score_adj: let
    # containerd clamp pod scores to its own instead of failing (as rootless kind)
    info "no CAP_SYS_RESOURCE: containerd restrict_oom_score_adj = true"
    sed -i -E 's/^([[:space:]]*restrict_oom_score_adj[[:space:]]*=[[:space:]]*).*/\1true/' /etc/containerd/config.toml
  fi
  if [[ -n "$want" ]] && [[ -f /etc/containerd/config.toml ]]; then
    info "containerd snapshotter: $want"
    sed -i -E "s/^([[:space:]]*snapshotter[[:space:]]*=[[:space:]]*).*/\1\"$want\"/" /etc/containerd/config.toml
  fi
}

fix_kmsg() {
  # the kubelet's OOM watcher opens /dev/kmsg; some sandboxes have none
  if [[ ! -e /dev/kmsg ]]; then
    if [[ -e /dev/console ]]; then
      warn "/dev/kmsg missing, linking it to /dev/console"
      ln -s /dev/console /dev/kmsg
    else
      warn "/dev/kmsg and /dev/console are both missing"
    fi
  fi
}

fix_mount() {
  # mount/umount must not be setuid and must be root's, also under userns-remap
  local m
  for m in "$(command -v mount)" "$(command -v umount)"; do
    chown root:root "$m"
    chmod u-s "$m"
  done
  # --privileged makes /sys writable; systemd expects it read-only in a container
  # Without --privileged (see has_cap) the cgroup hierarchies come
  # read-only; systemd and the kubelet must create cgroups in them.
  local target opts
  while read -r target opts; do
    if [[ ",$opts," == *,ro,* ]]; then
      info "remounting $target read-write"
      mount -o remount,bind,rw "$target" || warn "could not remount $target read-write"
    fi
  done < <(findmnt -rn -o TARGET,OPTIONS -t cgroup,cgroup2,tmpfs | grep_ok '^/sys/fs/cgroup')
  info "remounting /sys read-only"
  mount -o remount,ro /sys || warn "could not remount /sys read-only"
  # kubelet and containerd need shared mount propagation
  info "making mounts shared"
  mount --make-rshared /
}

# Create a cgroup-root for the kubelet in one v1 hierarchy and pin it with a
# self bind mount so systemd does not garbage-collect it before the kubelet runs.
kubelet_cgroup_root() {
  local root=$1 hier=$2
  mkdir -p "${hier}${root}"
  if [[ "$hier" == /sys/fs/cgroup/cpuset ]]; then
    # an empty cpuset makes attaching any task fail with ENOSPC
    cat "$hier/cpuset.cpus" >"${hier}${root}/cpuset.cpus"
    cat "$hier/cpuset.mems" >"${hier}${root}/cpuset.mems"
  fi
  if ! findmnt -rn "${hier}${root}" >/dev/null; then
    mount --bind "${hier}${root}" "${hier}${root}"
  fi
}

fix_cgroup() {
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    # cgroup v2: Docker gives every container its own cgroup namespace; the
    # kubelet cgroup is created by the kubelet unit once systemd has moved
    # the processes out of the root cgroup (see 11-kube-harness.conf).
    info "detected cgroup v2"
    return
  fi
  # kind waits for this line (or systemd's multi-user target) before its first exec
  info "detected cgroup v1"
  # The cgroup path of this process in the cpu hierarchy tells whether we
  # have a private cgroup namespace ("/") or see the host's tree.
  local self
  self=$(grep -E '^[^:]*:([^:]*,)?cpu(,[^,:]*)?:' /proc/self/cgroup | head -n1 | cut -d: -f3)
  if [[ "$self" == "/" ]]; then
    info "private cgroup namespace: no cgroup fix-ups needed"
    kubelet_cgroup_roots "$(findmnt -rn -o TARGET -t cgroup | grep_ok '^/sys/fs/cgroup/')"
    return
  fi
  warn "no cgroup namespace (cgroup path $self): applying cgroup v1 fix-ups"

  # Hierarchies Docker did not scope to this container (e.g. ones the
  # runtime does not know) expose the host root: a nested runtime would
  # leak cgroups there. Unmount them.
  local scoped unscoped mnt
  scoped=$(findmnt -rn -o SOURCE,TARGET -t cgroup | grep_ok -F "$self" | awk '{print $2}')
  unscoped=$(findmnt -rn -o SOURCE,TARGET -t cgroup | grep_ok -vF "$self" | awk '{print $2}')
  if [[ -n "$unscoped" ]]; then
    while IFS= read -r mnt; do
      info "unmounting unscoped cgroup hierarchy $mnt"
      umount "$mnt" || true
      rmdir "$mnt" 2>/dev/null || true
    done <<<"$unscoped"
  fi

  # Docker bind-mounts /sys/fs/cgroup/<h>/docker/<id> onto /sys/fs/cgroup/<h>,
  # but /proc/<pid>/cgroup still names the full host path. Make that path
  # exist too (bind the hierarchy onto <h><path>) so the kubelet and cAdvisor
  # find the cgroups they read from /proc.
  local lines root target
  lines=$(grep -E -o '/[[:alnum:]].* /sys/fs/cgroup.*.*cgroup' /proc/self/mountinfo || true)
  if [[ -n "$lines" ]]; then
    root=$(head -n1 <<<"$lines" | cut -d' ' -f1)
    for mnt in $(cut -d' ' -f2 <<<"$lines"); do
      target="${mnt}${root}"
      if ! findmnt -rn "$target" >/dev/null; then
        mkdir -p "$target"
        mount --bind "$mnt" "$target"
      fi
    done
  fi

  kubelet_cgroup_roots "$scoped"
}

# Nested kubelets must not manage cgroups they do not own: a kubelet given
# --cgroup-root=/kubelet (as kind's and CAPD's configs do; kubelet.slice under
# the systemd driver) finds that root in every v1 hierarchy ($1: their mount
# points), name=systemd included. Unused when the kubelet has no cgroup-root.
kubelet_cgroup_roots() {
  local mnt
  mount --make-rprivate /sys/fs/cgroup
  if [[ -n "$1" ]]; then
    while IFS= read -r mnt; do
      kubelet_cgroup_root /kubelet "$mnt"
      kubelet_cgroup_root /kubelet.slice "$mnt"
    done <<<"$1"
  fi
  if [[ "$1" != */sys/fs/cgroup/systemd* ]] && [[ -d /sys/fs/cgroup/systemd ]]; then
    kubelet_cgroup_root /kubelet.slice /sys/fs/cgroup/systemd
  fi
}

fix_machine_id() {
  # Each machine needs its own machine-id (kubelet, CNIs and journald use
  # it). Keep it across restarts of the same machine, but never inherit one
  # from the image: the owner file records which hostname it was made for.
  local me
  me=$(hostname)
  if [[ ! -s /etc/machine-id ]] || [[ "$(cat "$STATE/machine-id.owner" 2>/dev/null || true)" != "$me" ]]; then
    info "generating /etc/machine-id"
    rm -f /etc/machine-id
    systemd-machine-id-setup >/dev/null
    echo "$me" >"$STATE/machine-id.owner"
  fi
}

fix_product_files() {
  # All containers share the host's DMI: give each machine its own
  # product_uuid (kubeadm and some CNIs key on it) and a neutral product name.
  if [[ ! -s "$STATE/product_uuid" ]] || [[ "$(cat "$STATE/product.owner" 2>/dev/null || true)" != "$(hostname)" ]]; then
    cat /proc/sys/kernel/random/uuid >"$STATE/product_uuid"
    hostname >"$STATE/product.owner"
  fi
  echo kube-harness >"$STATE/product_name"
  local f
  for f in /sys/class/dmi/id/product_name /sys/devices/virtual/dmi/id/product_name; do
    [[ -f "$f" ]] && mount -o ro,bind "$STATE/product_name" "$f" || true
  done
  for f in /sys/class/dmi/id/product_uuid /sys/devices/virtual/dmi/id/product_uuid; do
    [[ -f "$f" ]] && mount -o ro,bind "$STATE/product_uuid" "$f" || true
  done
}

select_iptables() {
  # Use the backend the host (Docker) already uses, so rules land in the same
  # tables: whichever of legacy/nft holds more rules.
  local legacy nft mode
  legacy=$( (iptables-legacy-save || true; ip6tables-legacy-save || true) 2>/dev/null | grep -c '^-' || true)
  nft=$( (timeout 5 sh -c "iptables-nft-save; ip6tables-nft-save" || true) 2>/dev/null | grep -c '^-' || true)
  if [[ "${legacy:-0}" -gt "${nft:-0}" ]]; then mode=legacy; else mode=nft; fi
  info "iptables backend: $mode (legacy rules: ${legacy:-0}, nft rules: ${nft:-0})"
  update-alternatives --set iptables "/usr/sbin/iptables-$mode" >/dev/null || warn "could not select iptables-$mode"
  update-alternatives --set ip6tables "/usr/sbin/ip6tables-$mode" >/dev/null || true
}

network_magic() {
  # Docker's embedded DNS (127.0.0.11) is loopback-only: pods that get the
  # node's resolv.conf cannot reach it. Re-point Docker's DNAT rules from
  # 127.0.0.11 to a routable node-side address and rewrite resolv.conf.
  local dns=127.0.0.11 hostip
  if grep -q "nameserver $dns" /etc/resolv.conf 2>/dev/null; then
    hostip=$( (getent ahostsv4 host.docker.internal | head -n1 | cut -d' ' -f1) || true)
    if [[ -z "$hostip" ]] || [[ "$hostip" =~ ^127\. ]]; then
      hostip=$(ip -4 route show default | awk '{print $3; exit}')
    fi
    if [[ -n "$hostip" ]] && iptables-save -t nat >/tmp/nat.rules 2>/dev/null && grep -q DOCKER_OUTPUT /tmp/nat.rules; then
      sed -e "s/-d ${dns}/-d ${hostip}/g" \
          -e 's/-A OUTPUT \(.*\) -j DOCKER_OUTPUT/\0\n-A PREROUTING \1 -j DOCKER_OUTPUT/' \
          -e "s/--to-source :53/--to-source ${hostip}:53/g" /tmp/nat.rules | iptables-restore \
        && { cp /etc/resolv.conf /etc/resolv.conf.original
             sed -e "s/${dns}/${hostip}/g" /etc/resolv.conf.original >/etc/resolv.conf
             info "DNS via $hostip (Docker embedded DNS re-pointed)"; } \
        || warn "could not rewrite Docker DNS rules; keeping $dns"
    fi
    rm -f /tmp/nat.rules
  fi

  # A restarted container can get a new address: fix the old one in the
  # kubeadm-generated static pod manifests and kubelet flags.
  local cur old
  cur=$( (getent ahostsv4 "$(hostname)" | head -n1 | cut -d' ' -f1) || true)
  if [[ -n "$cur" ]]; then
    if [[ -s "$STATE/old-ipv4" ]]; then
      old=$(cat "$STATE/old-ipv4")
      if [[ "$old" != "$cur" ]]; then
        info "address changed $old -> $cur, updating kubeadm files"
        sed -i "s#${old}#${cur}#g" /etc/kubernetes/manifests/*.yaml 2>/dev/null || true
        sed -i "s#${old}#${cur}#g" /var/lib/kubelet/kubeadm-flags.env 2>/dev/null || true
      fi
    fi
    echo -n "$cur" >"$STATE/old-ipv4"
  fi
}

configure_proxy
configure_containerd
fix_kmsg
fix_mount
fix_cgroup
fix_machine_id
fix_product_files
select_iptables
network_magic

if [[ $# -eq 0 ]]; then
  set -- /sbin/init
fi
info "starting $*"
exec "$@"
