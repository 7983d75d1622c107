#!/bin/bash
# kh-cni-agent: run kh-cni-sync periodically (kube-harness, harness/kubeadm/cni.py)
set -o nounset
. @ENV@
# the API server as this node's kubelet reaches it; credentials of the
# kube-harness-cni ServiceAccount (the node authorizer lets a kubelet read
# only its own Node)
api() {
  local server
  server=$(awk '$1 == "server:" {print $2; exit}' /etc/kubernetes/kubelet.conf 2>/dev/null) || return 1
  [[ -n "$server" && -s @TOKEN@ ]] || return 1
  kubectl --server="$server" --token="$(cat @TOKEN@)" --certificate-authority=/etc/kubernetes/pki/ca.crt \
    --request-timeout=10s "$@"
}
jp='{range .items[*]}{.metadata.name}{"|"}{range .spec.podCIDRs[*]}{@}{","}{end}{"|"}{range .status.addresses[?(@.type=="InternalIP")]}{.address}{","}{end}{"\n"}{end}'
while :; do
  if raw=$(api get nodes -o jsonpath="$jp" 2>/dev/null); then
    # lists lose their trailing comma; empty fields become "-" for kh-cni-sync
    table=$(awk -F'|' 'NF {sub(/,$/, "", $2); sub(/,$/, "", $3); printf "%s %s %s\n", $1, ($2 != "" ? $2 : "-"), ($3 != "" ? $3 : "-")}' <<<"$raw")
    out=$(@SYNC@ "$NODE_NAME" "$CLUSTER_POD_CIDR" "${SERVICE_CIDR:-}" <<<"$table" 2>&1) || echo "kh-cni-sync failed: $out"
    [[ -n "$out" ]] && echo "$out"
  fi
  sleep "${INTERVAL:-@INTERVAL@}"
done
