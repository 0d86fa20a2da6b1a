//! A QuestDB pod without the operator: the operator's pod shape (core/src/desired/statefulset.rs)
//! pinned to a node, its server.conf from the ConfigMap `db`, its data on the claim `db-data`.

use serde_json::{json, Value};

/// `db-0` running `image` on `node`; `env` and `resources` (JSON) go on the container as given
/// (`[]` and `{}` for none).
pub fn database_pod(image: &str, node: &str, env: Value, resources: Value) -> Value {
    let probe = |period: i32, failures: i32| {
        json!({"httpGet": {"path": "/status", "port": "health"}, "periodSeconds": period,
               "timeoutSeconds": 5, "failureThreshold": failures})
    };
    json!({
        "metadata": {"name": "db-0", "labels": {"app": "db"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "terminationGracePeriodSeconds": 60,
            "initContainers": [{"name": "init-conf", "image": image,
                "command": ["mkdir", "-p", "/var/lib/questdb/conf"],
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/questdb"}]}],
            "containers": [{
                "name": "questdb", "image": image,
                "env": env,
                "resources": resources,
                "ports": [
                    {"name": "http", "containerPort": 9000, "protocol": "TCP"},
                    {"name": "pgwire", "containerPort": 8812, "protocol": "TCP"},
                    {"name": "health", "containerPort": 9003, "protocol": "TCP"},
                ],
                "volumeMounts": [
                    {"name": "data", "mountPath": "/var/lib/questdb"},
                    {"name": "config", "mountPath": "/var/lib/questdb/conf/server.conf",
                     "subPath": "server.conf", "readOnly": true},
                ],
                "startupProbe": probe(2, 120),
                "readinessProbe": probe(2, 3),
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "db-data"}},
                {"name": "config", "configMap": {"name": "db"}},
            ],
        },
    })
}
