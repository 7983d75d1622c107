#!/bin/bash
# kh-cni-sync: make this node's CNI config, pod routes and masquerade rules
# match the node table on stdin ("name podCIDRs internalIPs" lines, lists
# comma-separated, "-" = none). IPv4, IPv6 or both.
# Idempotent; written by kube-harness (harness/kubeadm/cni.py).
set -o errexit -o nounset -o pipefail
self=${1:?node name} cluster_cidrs=${2:?cluster pod CIDRs} service_cidrs=${3:-}
conflist=${KH_CNI_CONFLIST:-@CONFLIST@}
ipam_dir=${KH_CNI_IPAM_DIR:-@IPAM@}
chain=@CHAIN@
svc_chain=@SVC_CHAIN@
table=$(cat)
# one sync at a time (the harness and the node agent both run this)
exec 9>"${KH_CNI_LOCK:-/run/kh-cni.lock}"
flock -w 30 9

family() { if [[ "$1" == *:* ]]; then echo 6; else echo 4; fi; }
ipt() { local f=$1; shift; if [[ $f == 6 ]]; then ip6tables "$@"; else iptables "$@"; fi; }
ipt_restore() { if [[ $1 == 6 ]]; then ip6tables-restore --noflush; else iptables-restore --noflush; fi; }
route_dev() { ip -"$1" route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i+1); exit}}'; }

mine=$(awk -v n="$self" '$1 == n && $2 != "-" {print $2; exit}' <<<"$table")
if [[ -n "$mine" ]]; then
  dev=$(route_dev 4)
  [[ -n "$dev" ]] || dev=$(route_dev 6)
  mtu=$(cat "/sys/class/net/${dev:-eth0}/mtu" 2>/dev/null || echo 1500)
  ranges="" defaults=""
  for cidr in ${mine//,/ }; do
    if [[ $(family "$cidr") == 6 ]]; then dst="::/0"; else dst="0.0.0.0/0"; fi
    ranges+="${ranges:+, }[{\"subnet\": \"$cidr\"}]"
    defaults+="${defaults:+, }{\"dst\": \"$dst\"}"
  done
  want=$(cat <<EOF
{
  "cniVersion": "0.4.0",
  "name": "@NETWORK@",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "mtu": $mtu,
      "ipam": {
        "type": "host-local",
        "dataDir": "$ipam_dir",
        "ranges": [$ranges],
        "routes": [$defaults]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
)
  have=$(cat "$conflist" 2>/dev/null || true)
  if [[ "$have" != "$want" ]]; then
    mkdir -p "$(dirname "$conflist")"
    printf '%s\n' "$want" >"$conflist.tmp.$$"
    if [[ -n "$have" && "$have" != *"\"ranges\": [$ranges]"* ]]; then
      # the node got other podCIDRs: addresses allocated from the old ones are stale
      rm -rf "${ipam_dir:?}/@NETWORK@"
    fi
    mv "$conflist.tmp.$$" "$conflist"
    echo "conflist $mine mtu $mtu"
  fi
fi

# routes to the other nodes' pod CIDRs, via their address of the same family
declare -A want_routes=()
while read -r name cidrs ips; do
  [[ -z "$name" || "$name" == "$self" || "$cidrs" == "-" || "$ips" == "-" ]] && continue
  for cidr in ${cidrs//,/ }; do
    f=$(family "$cidr") via=""
    for a in ${ips//,/ }; do
      if [[ $(family "$a") == "$f" ]]; then via=$a; break; fi
    done
    [[ -z "$via" ]] && continue
    want_routes["$cidr"]=$via
    cur=$(ip -"$f" route show exact "$cidr" 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "via") {print $(i+1); exit}}')
    if [[ "$cur" != "$via" ]]; then
      ip -"$f" route replace "$cidr" via "$via"
      echo "route $cidr via $via"
    fi
  done
done <<<"$table"

for cluster_cidr in ${cluster_cidrs//,/ }; do
  f=$(family "$cluster_cidr")
  # stale routes (a node that is gone or got another podCIDR)
  while read -r dst rest; do
    [[ -z "$dst" || "$rest" != *" via "* && "$rest" != "via "* ]] && continue
    if [[ -z "${want_routes[$dst]+x}" ]]; then
      ip -"$f" route del "$dst" || true
      echo "route $dst removed"
    fi
  done < <(ip -"$f" route show root "$cluster_cidr" 2>/dev/null || true)

  # masquerade pod traffic that leaves the pod network (atomic refill of our chain)
  rules=$(cat <<EOF
*nat
:$chain - [0:0]
-A $chain -d $cluster_cidr -m comment --comment "kube-harness cni: pod to pod" -j RETURN
-A $chain -m comment --comment "kube-harness cni: leaving the pod network" -j MASQUERADE
COMMIT
EOF
)
  ipt_restore "$f" <<<"$rules"
  if ! ipt "$f" -t nat -C POSTROUTING -s "$cluster_cidr" -m comment --comment "kube-harness cni" -j "$chain" 2>/dev/null; then
    ipt "$f" -t nat -A POSTROUTING -s "$cluster_cidr" -m comment --comment "kube-harness cni" -j "$chain"
    echo "masquerade $cluster_cidr"
  fi
done

# Service IPs never leave the cluster: what kube-proxy did not DNAT (a port
# no Service has) is rejected here, not sent to the host's network, which
# may answer it (filter runs after kube-proxy's nat rules).
for service_cidr in ${service_cidrs//,/ }; do
  f=$(family "$service_cidr")
  rules=$(cat <<EOF
*filter
:$svc_chain - [0:0]
-A $svc_chain -p tcp -m comment --comment "kube-harness cni: no such Service port" -j REJECT --reject-with tcp-reset
-A $svc_chain -m comment --comment "kube-harness cni: no such Service port" -j REJECT
COMMIT
EOF
)
  ipt_restore "$f" <<<"$rules"
  for hook in FORWARD OUTPUT; do
    if ! ipt "$f" -C "$hook" -d "$service_cidr" -m comment --comment "kube-harness cni" -j "$svc_chain" 2>/dev/null; then
      ipt "$f" -A "$hook" -d "$service_cidr" -m comment --comment "kube-harness cni" -j "$svc_chain"
      echo "reject unserved $service_cidr ($hook)"
    fi
  done
done
