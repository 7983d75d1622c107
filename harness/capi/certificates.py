"""Webhook serving certificates for the providers, in place of cert-manager.

Every Cluster API provider's components carry cert-manager objects: a
``selfSigned`` Issuer, a Certificate whose Secret the manager mounts for
its webhook server (``--webhook-cert-dir``), and ``cert-manager.io/
inject-ca-from`` annotations on its CRDs (conversion webhooks) and webhook
configurations. cert-manager's controllers cannot be built here (the Go
module proxy serves the cert-manager module, but not its ``cmd/*`` modules),
so the harness does their two jobs itself:

* issuing: for every Certificate of the given namespaces whose Secret is
  missing, a self-signed serving certificate for its ``dnsNames`` is written
  to ``spec.secretName`` (``tls.crt``, ``tls.key``, ``ca.crt``, as
  cert-manager's selfSigned issuer does), and the Certificate's status says
  Ready;
* CA injection: the ``caBundle`` of every CRD and webhook configuration that
  names one of those Certificates (``inject-ca-from``) or Secrets
  (``inject-ca-from-secret``).

The cert-manager CRDs themselves are the real ones, from the cert-manager
module's ``deploy/crds`` (see :mod:`harness.build.capi`), so the objects are
validated by cert-manager's own schemas; ``clusterctl init`` finds that API
and does not try to install cert-manager from the internet.
"""
from __future__ import annotations

import base64
import datetime
import logging
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger("harness.capi")

CM_GROUP, CM_VERSION = "cert-manager.io", "v1"
INJECT_FROM = "cert-manager.io/inject-ca-from"
INJECT_FROM_SECRET = "cert-manager.io/inject-ca-from-secret"
VALIDITY = datetime.timedelta(days=365)


class CertificateError(Exception):
    pass


@dataclass(frozen=True)
class Issued:
    namespace: str
    certificate: str
    secret: str
    ca_pem: bytes


def self_signed(common_name: str, dns_names: list[str], organizations: list[str] | None = None) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM): a self-signed serving certificate that is its own CA, as
    cert-manager's selfSigned issuer makes it."""
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations or []]
    name = x509.Name(attrs)
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(d) for d in dns_names]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, key_cert_sign=True,
                                         content_commitment=False, data_encipherment=False, key_agreement=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


class CertificateIssuer:
    """Issues the Certificates of some namespaces and injects their CA (see module doc)."""

    def __init__(self, api: client.ApiClient):
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.crds = client.ApiextensionsV1Api(api)
        self.admission = client.AdmissionregistrationV1Api(api)

    def reconcile(self, namespaces: list[str]) -> list[Issued]:
        """Issue what is missing in ``namespaces``, then inject every CA bundle; returns
        the Certificates (issued now or before) that were found."""
        issued = [self._ensure(ns, c) for ns in namespaces for c in self._certificates(ns)]
        by_cert = {f"{i.namespace}/{i.certificate}": i.ca_pem for i in issued}
        by_secret = {f"{i.namespace}/{i.secret}": i.ca_pem for i in issued}
        self._inject(by_cert, by_secret)
        return issued

    def _certificates(self, namespace: str) -> list[dict]:
        try:
            return self.custom.list_namespaced_custom_object(CM_GROUP, CM_VERSION, namespace, "certificates")["items"]
        except ApiException as e:
            if e.status == 404:
                raise CertificateError("the cert-manager.io/v1 API is not installed in the management cluster "
                                       "(install_cert_manager_crds first)") from e
            raise

    def _issuer_type(self, namespace: str, ref: dict) -> str:
        kind = ref.get("kind", "Issuer")
        plural = {"Issuer": "issuers", "ClusterIssuer": "clusterissuers"}.get(kind)
        if plural is None:
            raise CertificateError(f"issuerRef.kind {kind!r}; allowed: Issuer, ClusterIssuer")
        if kind == "Issuer":
            obj = self.custom.get_namespaced_custom_object(CM_GROUP, CM_VERSION, namespace, plural, ref["name"])
        else:
            obj = self.custom.get_cluster_custom_object(CM_GROUP, CM_VERSION, plural, ref["name"])
        spec_kind = next(iter(obj.get("spec") or {}), "")
        return spec_kind

    def _ensure(self, namespace: str, cert: dict) -> Issued:
        name, spec = cert["metadata"]["name"], cert.get("spec") or {}
        secret_name = spec.get("secretName")
        if not secret_name:
            raise CertificateError(f"Certificate {namespace}/{name}: spec.secretName is empty")
        try:
            existing = self.core.read_namespaced_secret(secret_name, namespace)
            ca = base64.b64decode((existing.data or {}).get("ca.crt", ""))
            if ca:
                return Issued(namespace, name, secret_name, ca)
        except ApiException as e:
            if e.status != 404:
                raise
        issuer = self._issuer_type(namespace, spec.get("issuerRef") or {})
        if issuer != "selfSigned":
            raise CertificateError(f"Certificate {namespace}/{name}: issuer of type {issuer!r}; the harness "
                                   f"issues certificates in place of cert-manager for selfSigned issuers only")
        dns = spec.get("dnsNames") or []
        if not dns:
            raise CertificateError(f"Certificate {namespace}/{name}: spec.dnsNames is empty")
        crt, key = self_signed(spec.get("commonName") or dns[0], dns, (spec.get("subject") or {}).get("organizations"))
        data = {k: base64.b64encode(v).decode() for k, v in (("tls.crt", crt), ("tls.key", key), ("ca.crt", crt))}
        secret = client.V1Secret(type="kubernetes.io/tls", data=data, metadata=client.V1ObjectMeta(
            name=secret_name, namespace=namespace,
            annotations={"cert-manager.io/certificate-name": name, "harness.k8s.io/issued-by": "kube-harness"}))
        try:
            self.core.create_namespaced_secret(namespace, secret)
        except ApiException as e:
            if e.status != 409:  # another process issued it meanwhile: take that one
                raise
            return self._ensure(namespace, cert)
        self._mark_ready(namespace, name)
        log.info(f"issued {namespace}/{secret_name} for Certificate {name} ({', '.join(dns)})",
                 extra={"phase": "certificates"})
        return Issued(namespace, name, secret_name, crt)

    def _mark_ready(self, namespace: str, name: str) -> None:
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Issued",
                                              "message": "issued by kube-harness in place of cert-manager",
                                              "lastTransitionTime": now}]}}
        self.custom.patch_namespaced_custom_object_status(CM_GROUP, CM_VERSION, namespace, "certificates", name,
                                                          status)

    def _inject(self, by_cert: dict[str, bytes], by_secret: dict[str, bytes]) -> None:
        def bundle(annotations: dict | None) -> str | None:
            a = annotations or {}
            ca = by_cert.get(a.get(INJECT_FROM, "")) or by_secret.get(a.get(INJECT_FROM_SECRET, ""))
            return base64.b64encode(ca).decode() if ca else None

        for crd in self.crds.list_custom_resource_definition().items:
            ca = bundle(crd.metadata.annotations)
            conv = crd.spec.conversion
            if ca and conv and conv.webhook and conv.webhook.client_config and \
                    conv.webhook.client_config.ca_bundle != ca:
                self.crds.patch_custom_resource_definition(crd.metadata.name, {"spec": {"conversion": {
                    "webhook": {"clientConfig": {"caBundle": ca}}}}})
        for lister, patcher in (
                (self.admission.list_validating_webhook_configuration,
                 self.admission.patch_validating_webhook_configuration),
                (self.admission.list_mutating_webhook_configuration,
                 self.admission.patch_mutating_webhook_configuration)):
            for cfg in lister().items:
                ca = bundle(cfg.metadata.annotations)
                if not ca or all(w.client_config.ca_bundle == ca for w in cfg.webhooks or []):
                    continue
                hooks = [{"name": w.name, "clientConfig": {"caBundle": ca}} for w in cfg.webhooks or []]
                # strategic merge: webhooks are merged by name
                patcher(cfg.metadata.name, {"webhooks": hooks})
