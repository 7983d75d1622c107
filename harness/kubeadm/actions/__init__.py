"""kubeadm bootstrap as small ordered actions sharing an :class:`~.context.ActionContext`,
as kind's create actions: image, kubeadm_config, kubeadm_init, cni, join, ready, remove,
upgrade. :class:`harness.kubeadm.bootstrap.KubeadmBootstrapper` runs them."""
