"""A throw-away Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager
and the fake kubelet, built by build.sh and started as child processes.

Used by conftest.py (one per test session) and runnable by hand:

    python tests/cluster/kube_cluster.py     # starts everything, prints KUBECONFIG=..., Ctrl-C stops
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

HERE = Path(__file__).resolve().parent
ADMIN_TOKEN = "llmdeploy-test-admin-token"
# more static tokens the API server accepts (system:masters too): what the exec-plugin test's plugin
# hands out, and the in-cluster test's service-account token file
EXEC_TOKEN = "llmdeploy-test-exec-token"
SERVICE_ACCOUNT_TOKEN = "llmdeploy-test-service-account-token"
# a name in the serving certificate that resolves nowhere (.invalid): reachable only through a proxy
PROXIED_NAME = "apiserver.llmdeploy.invalid"


def build_binaries() -> Path:
    """Run build.sh (a no-op once cached) and return the folder holding the binaries."""
    proc = subprocess.run(["bash", str(HERE / "build.sh")], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"tests/cluster/build.sh failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def _die_with_parent() -> None:
    """Runs in the child: have Linux send SIGTERM when the test process dies, even by SIGKILL."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _make_certs(pki: Path) -> None:
    pki.mkdir(parents=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-keyout",
        str(pki / "ca.key"),
        "-out",
        str(pki / "ca.crt"),
        "-subj",
        "/CN=llmdeploy-test-ca",
    )
    (pki / "san.cnf").write_text(
        "[req]\ndistinguished_name=dn\n[dn]\n[ext]\n"
        f"subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:{PROXIED_NAME}\n"
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(pki / "apiserver.key"),
        "-out",
        str(pki / "apiserver.csr"),
        "-subj",
        "/CN=kube-apiserver",
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(pki / "apiserver.csr"),
        "-CA",
        str(pki / "ca.crt"),
        "-CAkey",
        str(pki / "ca.key"),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        str(pki / "san.cnf"),
        "-extensions",
        "ext",
        "-out",
        str(pki / "apiserver.crt"),
    )
    _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    (pki / "tokens.csv").write_text(
        f'{ADMIN_TOKEN},test-admin,test-admin,"system:masters"\n'
        f'{EXEC_TOKEN},exec-admin,exec-admin,"system:masters"\n'
        f'{SERVICE_ACCOUNT_TOKEN},system:serviceaccount:default:llmdeploy,sa-llmdeploy,"system:masters"\n'
    )


def make_client_cert(pki: Path, user: str, group: str) -> tuple[Path, Path]:
    """A client certificate signed by the cluster CA: CN is the user name, O the group."""
    key, csr, crt = pki / f"{user}.key", pki / f"{user}.csr", pki / f"{user}.crt"
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        f"/O={group}/CN={user}",
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(pki / "ca.crt"),
        "-CAkey",
        str(pki / "ca.key"),
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        str(crt),
    )
    return crt, key


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))


@dataclass
class KubeCluster:
    workdir: Path
    bin_dir: Path
    server: str = ""
    kubeconfig: Path = field(default_factory=Path)
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent
        )
        log.close()
        self.procs.append((name, proc))
        return proc

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def _wait_ready(self, name: str, url: str, timeout_s: float, **kw: object) -> None:
        proc = dict(self.procs)[name]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            try:
                if httpx.get(url, timeout=2, **kw).status_code == 200:  # type: ignore[arg-type]
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{name} not ready after {timeout_s:.0f} s:\n{self.log_tail(name)}")

    def start(self) -> None:
        pki = self.workdir / "pki"
        _make_certs(pki)
        etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name",
                "test",
                "--data-dir",
                str(self.workdir / "etcd"),
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"test=http://127.0.0.1:{peer_port}",
                "--quota-backend-bytes",
                str(512 * 2**20),
                "--log-level",
                "warn",
            ],
        )
        self._wait_ready("etcd", f"{etcd_url}/health", 30)

        self.server = f"https://127.0.0.1:{api_port}"
        self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                "--etcd-servers",
                etcd_url,
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
                "--secure-port",
                str(api_port),
                "--cert-dir",
                str(pki),
                "--tls-cert-file",
                str(pki / "apiserver.crt"),
                "--tls-private-key-file",
                str(pki / "apiserver.key"),
                "--client-ca-file",
                str(pki / "ca.crt"),
                "--token-auth-file",
                str(pki / "tokens.csv"),
                "--authorization-mode",
                "RBAC",
                "--service-account-issuer",
                "https://kubernetes.default.svc",
                "--service-account-key-file",
                str(pki / "sa.pub"),
                "--service-account-signing-key-file",
                str(pki / "sa.key"),
                "--api-audiences",
                "https://kubernetes.default.svc",
                "--service-cluster-ip-range",
                "10.96.0.0/24",
                "--enable-admission-plugins",
                "NamespaceLifecycle",
                "--disable-admission-plugins",
                "ServiceAccount,StorageObjectInUseProtection,DefaultStorageClass,"
                "PersistentVolumeClaimResize,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ResourceQuota,"
                "LimitRanger,Priority,RuntimeClass,DefaultIngressClass,CertificateApproval,CertificateSigning,"
                "CertificateSubjectRestriction",
                "--allow-privileged=true",
                "--profiling=false",
                "--v",
                "1",
            ],
        )
        self._wait_ready(
            "kube-apiserver",
            f"{self.server}/readyz",
            90,
            verify=ssl.create_default_context(cafile=str(pki / "ca.crt")),
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )

        self.kubeconfig = self.workdir / "kubeconfig"
        write_kubeconfig(self.kubeconfig, self.server, pki / "ca.crt", ADMIN_TOKEN)
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                "--kubeconfig",
                str(self.kubeconfig),
                "--leader-elect=false",
                "--port",
                "0",
                "--secure-port",
                "0",
                "--controllers",
                "deployment,replicaset,garbagecollector,namespace,disruption",
                "--root-ca-file",
                str(pki / "ca.crt"),
                "--concurrent-deployment-syncs",
                "2",
                "--concurrent-replicaset-syncs",
                "2",
                "--v",
                "1",
            ],
        )
        self._spawn(
            "fake-kubelet",
            [
                sys.executable,
                str(HERE / "fake_kubelet.py"),
                "--kubeconfig",
                str(self.kubeconfig),
            ],
        )

    def stop(self) -> None:
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _name, proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()


def main() -> None:
    bin_dir = build_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="llmdeploy-kube-"))
    cluster = KubeCluster(workdir, bin_dir)

    def _stop_on_sigterm(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        cluster.start()
        print(f"KUBECONFIG={cluster.kubeconfig}", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
