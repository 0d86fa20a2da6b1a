//! Fixtures shared by the conformance tests.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::Client;
use questdb_sim::{Sim, SimConfig};
use serde_json::json;

/// Every wait in these tests is bounded by this.
pub const WAIT: Duration = Duration::from_secs(20);

pub async fn sim() -> Sim {
    Sim::start(SimConfig::default())
        .await
        .expect("simulator starts")
}

pub async fn sim_with(cfg: SimConfig) -> Sim {
    Sim::start(cfg).await.expect("simulator starts")
}

/// Awaits `fut`, failing the test instead of hanging.
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

pub fn configmaps(client: &Client) -> Api<ConfigMap> {
    Api::namespaced(client.clone(), "default")
}

pub fn configmap(name: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "data": {"k": "v"},
    }))
    .expect("valid ConfigMap")
}

/// `widgets.example.com`: status subresource, printer columns, a default, a CEL transition
/// rule and a cross-field rule with a message expression.
pub fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "shortNames": ["wd"]},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "x-kubernetes-validations": [{
                                "rule": "!has(self.max) || self.size <= self.max",
                                "messageExpression": "'size ' + string(self.size) + ' exceeds max'"
                            }],
                            "properties": {
                                "size": {"type": "integer", "minimum": 0, "x-kubernetes-validations": [
                                    {"rule": "self >= oldSelf", "message": "size may not shrink"}
                                ]},
                                "max": {"type": "integer"},
                                "color": {"type": "string", "default": "blue", "enum": ["blue", "red"]},
                                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                            }
                        },
                        "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
                    }
                }}
            }]
        }
    }))
    .expect("valid CRD")
}

pub fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    )
}

pub async fn install_widgets(client: &Client) -> Api<DynamicObject> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &widget_crd())
        .await
        .expect("CRD is accepted");
    Api::namespaced_with(client.clone(), "default", &widget_resource())
}

pub fn widget(name: &str, spec: serde_json::Value) -> DynamicObject {
    let mut obj = DynamicObject::new(name, &widget_resource());
    obj.data = json!({"spec": spec});
    obj
}

/// The HTTP status of a kube error, for asserting on the apiserver's answers.
pub fn code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

pub fn reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.reason.clone(),
        other => panic!("expected an API error, got {other:?}"),
    }
}
