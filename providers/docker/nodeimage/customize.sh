#!/bin/sh
# Runs inside the freshly bootstrapped rootfs (chroot) after the packages are
# installed and files/ was copied in. Turns a Debian rootfs into a node base
# image the way kind configures its base image: systemd as a container init,
# containerd + CNI as the kubelet's runtime, kubelet unit waiting for kubeadm.
#
# usage: customize.sh SANDBOX_IMAGE
set -eu
SANDBOX_IMAGE=$1

echo "I: kube-harness customize: permissions and directories"
chmod 0755 /usr/local/bin/entrypoint.sh /usr/local/bin/kh-*.sh
find /etc/containerd /etc/systemd/system /etc/sysctl.d /etc/systemd/journald.conf.d -type f -exec chmod 0644 {} +
mkdir -p /etc/kubernetes/manifests /etc/cni/net.d /opt/cni/bin /var/lib/kubelet /etc/containerd/certs.d \
  /usr/local/etc/haproxy /etc/kube-harness /var/log/pods /var/log/containers
ln -sf entrypoint.sh /usr/local/bin/entrypoint

echo "I: kube-harness customize: CNI plugins in /opt/cni/bin"
ls /opt/cni/bin | tr '\n' ' '; echo

echo "I: kube-harness customize: containerd sandbox image $SANDBOX_IMAGE"
sed -i "s|@SANDBOX_IMAGE@|$SANDBOX_IMAGE|" /etc/containerd/config.toml
grep -q "sandbox = \"$SANDBOX_IMAGE\"" /etc/containerd/config.toml

cat >/etc/systemd/system/kubelet.slice <<'EOF'
[Unit]
Description=slice used to run Kubernetes / Kubelet
Before=slices.target

[Slice]
MemoryAccounting=true
CPUAccounting=true
EOF

# crictl comes with the node image (same minor as Kubernetes)
cat >/etc/crictl.yaml <<'EOF'
runtime-endpoint: unix:///run/containerd/containerd.sock
image-endpoint: unix:///run/containerd/containerd.sock
timeout: 10
EOF

# placeholder; the load balancer container gets its real config from the provider
cat >/usr/local/etc/haproxy/haproxy.cfg <<'EOF'
global
  log stdout format raw local0 info
defaults
  mode tcp
  timeout connect 5s
  timeout client 1h
  timeout server 1h
frontend control-plane
  bind *:6443
  default_backend kube-apiservers
backend kube-apiservers
EOF

echo "I: kube-harness customize: systemd units"
# Nothing a package enabled runs unless we enable it again below.
rm -f /etc/systemd/system/*.wants/* 2>/dev/null || true
rm -f /lib/systemd/system/multi-user.target.wants/getty.target
rm -f /lib/systemd/system/sockets.target.wants/*udev* /lib/systemd/system/sockets.target.wants/*initctl*
rm -f /lib/systemd/system/local-fs.target.wants/* 2>/dev/null || true
systemctl enable containerd.service kubelet.service

# Units that make no sense in a container: consoles and gettys (the tty is
# Docker's), kernel/hardware/filesystem setup done by the host, periodic
# maintenance, services a node must not run (haproxy runs only in the
# load balancer container, started by hand there).
for u in \
  getty.target console-getty.service container-getty@.service getty@.service serial-getty@.service \
  getty-static.service systemd-ask-password-console.path systemd-ask-password-wall.path \
  systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
  systemd-udev-trigger.service systemd-udev-settle.service systemd-hwdb-update.service \
  systemd-modules-load.service kmod-static-nodes.service systemd-firstboot.service \
  systemd-remount-fs.service systemd-journald-audit.socket systemd-machine-id-commit.service \
  sys-kernel-config.mount sys-kernel-debug.mount sys-kernel-tracing.mount sys-fs-fuse-connections.mount \
  dev-hugepages.mount systemd-binfmt.service proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount \
  systemd-pcrphase.service systemd-pcrphase-sysinit.service systemd-pcrphase-initrd.service \
  apt-daily.timer apt-daily-upgrade.timer apt-daily.service apt-daily-upgrade.service \
  e2scrub_all.timer e2scrub_reap.service fstrim.timer fstrim.service \
  haproxy.service \
  ; do
  systemctl mask "$u" >/dev/null 2>&1 || true
done

echo "I: kube-harness customize: machine identity"
# every machine generates its own (see entrypoint.sh)
: >/etc/machine-id
rm -f /var/lib/dbus/machine-id
ln -sf /etc/machine-id /var/lib/dbus/machine-id
rm -rf /etc/kube-harness/*
rm -f /etc/hostname
# kubelet / kubeadm find the right iptables via the entrypoint's selection
update-alternatives --set iptables /usr/sbin/iptables-nft >/dev/null
update-alternatives --set ip6tables /usr/sbin/ip6tables-nft >/dev/null

echo "I: kube-harness customize: versions"
containerd --version
runc --version | head -n1
containerd config dump >/dev/null
haproxy -v | head -n1
systemctl --version | head -n1
