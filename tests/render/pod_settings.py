"""A Kubernetes target with every pod setting a cluster policy asks for, shared by the render tests.

Only fields Kubernetes 1.20 knows, so the cluster test can apply the same settings.
"""

from __future__ import annotations

from typing import Any

POD_SETTINGS: dict[str, Any] = {
    "labels": {"team": "ml-platform", "cost-center": "c-42"},
    "annotations": {"owner.example.com/contact": "ml-platform@example.com"},
    "pod_labels": {"sidecar.istio.io/inject": "false"},
    "pod_annotations": {"prometheus.io/scrape": "true"},
    "service_account": "llm-engine",
    "automount_service_account_token": False,
    "image_pull_secrets": ["registry-creds"],
    "priority_class": "llm-serving",
    "node_affinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "node.example.com/pool", "operator": "In", "values": ["gpu"]}]}
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 50,
                "preference": {
                    "matchExpressions": [
                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}
                    ]
                },
            }
        ],
    },
    "topology_spread": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
    ],
    "resources": {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"cpu": 8, "memory": "48Gi"}},
    "env": [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "OTEL_SERVICE_NAME", "value": "llm"},
    ],
    "volumes": [{"name": "certs", "configMap": {"name": "corp-ca"}}],
    "volume_mounts": [{"name": "certs", "mountPath": "/etc/corp-ca", "readOnly": True}],
    "sidecars": [
        {
            "name": "log-shipper",
            "image": "example.com/log-shipper:1.2",
            "args": ["--input", "/tmp/engine.log"],
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        }
    ],
    "init_containers": [
        {
            "name": "wait-for-proxy",
            "image": "example.com/busybox:1.36",
            "command": ["sh", "-c", "until nc -z proxy 3128; do sleep 1; done"],
        }
    ],
    "patches": [
        {
            "patch": {
                "kind": "Deployment",
                "metadata": {"name": "PLACEHOLDER"},
                "spec": {"template": {"spec": {"dnsPolicy": "ClusterFirst", "enableServiceLinks": False}}},
            }
        },
        {
            "target": {"kind": "Service"},
            "patch": [
                {"op": "add", "path": "/metadata/annotations/lb.example.com~1internal", "value": "true"},
                {"op": "replace", "path": "/spec/ports/0/name", "value": "web"},
            ],
        },
    ],
}


def pod_settings(name: str) -> dict[str, Any]:
    """POD_SETTINGS for a recipe named `name` (the strategic-merge patch selects its Deployment)."""
    out = {**POD_SETTINGS, "patches": [dict(p) for p in POD_SETTINGS["patches"]]}
    first = out["patches"][0]
    first["patch"] = {**first["patch"], "metadata": {"name": name}}
    return out
