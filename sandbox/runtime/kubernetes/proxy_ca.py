"""The CA of an egress proxy on a cluster, for the secrets' hosts: made once, shared by every
replica of the orchestrator and every Pod of the proxy, trusted by that proxy's sandboxes only.

On Docker each proxy makes its own CA at start and the orchestrator copies it into its one
sandbox. On a cluster one proxy Deployment serves every sandbox of its policy in a namespace,
may restart, and several orchestrators make its sandboxes: a CA made by the proxy, or by each
orchestrator, would differ between them, and a sandbox would trust the wrong one. So the CA
lives in the Secret `proxy-<hash>-ca` (`mitmproxy-ca.pem`: key and certificate, what mitmproxy
loads from its confdir; `ca.crt`: the certificate alone). The first orchestrator to need it
creates it; another finds it (create answers 409) and reads it by name, the one Secret read its
Role grants (tenant.py: `get` on these names only, never on the policy's Secret, which holds
the values). Only a policy with secrets has a CA: the proxy decrypts nothing else.

A sandbox gets the certificate through an init container of its own image: the image's CA
bundle plus this one, written to an emptyDir the sandbox mounts read-only at the path the CA
variables name (runtime/egress_secrets.py), so the sandbox cannot change what it trusts.
Rotation: delete the Secret and restart the proxy's Deployment; new sandboxes trust the new CA.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

from sandbox.errors import SandboxUnavailable
from sandbox.runtime.egress_secrets import CA_BUNDLE, INSTALL_SCRIPT
from sandbox.runtime.kubernetes.names import policy_hash
from sandbox.runtime.kubernetes.proxy_secret import secret_object

KEY_FILE = "mitmproxy-ca.pem"  # mitmproxy's name for its CA's key and certificate in its confdir
CERT_FILE = "ca.crt"
CA_KIND = "egress-proxy-ca"
VALID_DAYS = 3650  # mitmproxy's own CAs last ten years; rotation is deleting the Secret
PROXY_CA_MOUNT = "/etc/egress-ca"  # the Secret, read-only, in the proxy's container
# the proxy copies its CA into mitmproxy's confdir (a folder it may write: mitmproxy adds files)
PROXY_CA_SCRIPT = (
    "set -e; umask 077; mkdir -p /tmp/mitmproxy; "
    f"cat {PROXY_CA_MOUNT}/{KEY_FILE} > /tmp/mitmproxy/mitmproxy-ca.pem; "
    f"cat {PROXY_CA_MOUNT}/{CERT_FILE} > /tmp/mitmproxy/mitmproxy-ca-cert.pem; "
    'exec "$@"'
)
BUNDLE_DIR = CA_BUNDLE.rsplit("/", 1)[0]  # /tmp/.egress: the emptyDir, read-only in the sandbox
BUNDLE_VOLUME = "egress-ca"


def ca_secret_name(digest: str) -> str:
    """The CA Secret of the proxy of policy `digest`."""
    return f"proxy-{digest}-ca"


def ca_placeholder(policy: dict[str, Any]) -> str:
    """What a Pod rendered without a cluster shows where its proxy's CA certificate goes ("" when
    the proxy decrypts nothing)."""
    if not decrypts(policy):
        return ""
    return f"<the certificate in Secret {ca_secret_name(policy_hash(policy))}, key {CERT_FILE}>"


def decrypts(policy: dict[str, Any]) -> bool:
    """Whether the proxy of `policy` decrypts anything (it has secrets), so has a CA."""
    return bool(policy.get("secrets"))


def new_ca(namespace: str, digest: str) -> tuple[str, str]:
    """A fresh CA: (key and certificate PEM, as mitmproxy loads them; the certificate PEM).

    RSA 2048 and SHA-256, as mitmproxy makes its own; named after the proxy it serves.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "agent-sandbox"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"egress proxy {digest} in {namespace}"[:64]),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=2))  # nodes whose clocks lag still accept it
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode("ascii")
    return key_pem + cert_pem, cert_pem


def ca_secret(tenant: str, namespace: str, digest: str, key_and_cert: str, cert: str) -> dict[str, Any]:
    """The CA Secret of one proxy."""
    return secret_object(
        ca_secret_name(digest), namespace, tenant, digest, CA_KIND, {KEY_FILE: key_and_cert, CERT_FILE: cert}
    )


def certificate_of(secret: dict[str, Any], where: str) -> str:
    """The CA certificate PEM a found CA Secret holds.

    Raises:
        SandboxUnavailable: it holds none (someone else's object, or damaged): a sandbox is not
            made to trust whatever is there.
    """
    from cryptography import x509

    raw = (secret.get("data") or {}).get(CERT_FILE)
    try:
        pem = base64.b64decode(str(raw), validate=True) if raw else b""
        cert = x509.load_pem_x509_certificate(pem)
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except (ValueError, x509.ExtensionNotFound) as exc:
        raise SandboxUnavailable(
            f"the egress proxy's CA Secret {where} holds no CA certificate in {CERT_FILE} ({exc.__class__.__name__}); "
            "delete it and restart the proxy's Deployment: the next egress sandbox makes a new one"
        ) from exc
    if not is_ca:
        raise SandboxUnavailable(f"the certificate in the egress proxy's CA Secret {where} is not a CA's")
    return pem.decode("ascii")


def proxy_ca_volume(digest: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the proxy Pod's volume of its CA Secret, the proxy container's read-only mount of it)."""
    volume = {
        "name": "ca",
        # 0440 to the proxy's group (fsGroup): the key is for the proxy's user alone
        "secret": {"secretName": ca_secret_name(digest), "defaultMode": 0o440},
    }
    return volume, {"name": "ca", "mountPath": PROXY_CA_MOUNT, "readOnly": True}


def bundle_step(
    image: str, pull_policy: str, cert: str, resources: dict[str, str], security: dict[str, Any]
) -> dict[str, Any]:
    """The init container that writes the sandbox's CA bundle (its image's CAs plus the proxy's),
    restricted like the sandbox container (`security`: its own)."""
    return {
        "name": "egress-ca",
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": ["/bin/sh", "-c", INSTALL_SCRIPT, "sh", cert],
        "workingDir": "/",
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": security,
        "volumeMounts": [{"name": BUNDLE_VOLUME, "mountPath": BUNDLE_DIR}],
    }


def bundle_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the bundle's emptyDir, the sandbox container's read-only mount of it)."""
    volume = {"name": BUNDLE_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    return volume, {"name": BUNDLE_VOLUME, "mountPath": BUNDLE_DIR, "readOnly": True}
