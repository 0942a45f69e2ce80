//! The Kubernetes API as the kube subnet manager needs it, behind one small
//! trait: the real one on kube-rs (here) and an in-memory one for tests
//! (`memory.rs`). What it needs is what kube-flannel's RBAC grants: nodes
//! get/list/watch, nodes/status patch, pods get.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config};
use serde_json::json;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ApiError {
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Failed(String),
}

/// Every Node, as kube-rs's watcher reports it: a listing (`Init`,
/// `InitApply`..., `InitDone`) at the start and after every watch that
/// broke or expired, then changes.
pub type NodeEvents = BoxStream<'static, Result<Event<Node>, ApiError>>;

pub trait NodeApi: Clone + Send + Sync + 'static {
    fn node(&self, name: &str) -> impl Future<Output = Result<Node, ApiError>> + Send;

    /// The node a Pod runs on (`spec.nodeName`), `None` before it is
    /// scheduled.
    fn pod_node(
        &self,
        namespace: &str,
        pod: &str,
    ) -> impl Future<Output = Result<Option<String>, ApiError>> + Send;

    /// Merges `annotations` into the Node's.
    fn annotate(
        &self,
        node: &str,
        annotations: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// A strategic merge patch on the Node's status.
    fn patch_status(
        &self,
        node: &str,
        patch: &serde_json::Value,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    fn watch(&self) -> NodeEvents;
}

/// How to reach the API server, flanneld's way: `--kubeconfig-file`,
/// `--kube-api-url` (overriding the kubeconfig's server, or alone: that URL
/// with no credentials), else the usual inference (`KUBECONFIG`, then the
/// in-cluster service account).
#[derive(Clone, Debug, Default)]
pub struct ApiOptions {
    pub kubeconfig: Option<PathBuf>,
    pub url: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiSetupError {
    #[error("reading the kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("--kube-api-url {url:?}: {why}")]
    Url { url: String, why: String },
    #[error(
        "no Kubernetes API config: give --kubeconfig-file or --kube-api-url, or run in a pod: {0}"
    )]
    Infer(kube::config::InferConfigError),
    #[error("setting up the Kubernetes client: {0}")]
    Client(kube::Error),
}

/// The API through kube-rs.
#[derive(Clone)]
pub struct KubeApi {
    client: Client,
    nodes: Api<Node>,
}

fn api_error(what: String, e: kube::Error) -> ApiError {
    match &e {
        kube::Error::Api(status) if status.code == 404 => ApiError::NotFound(what),
        _ => ApiError::Failed(format!("{what}: {e}")),
    }
}

impl KubeApi {
    pub async fn new(options: &ApiOptions) -> Result<KubeApi, ApiSetupError> {
        let url = options
            .url
            .as_ref()
            .map(|url| {
                url.parse::<http::Uri>().map_err(|e| ApiSetupError::Url {
                    url: url.clone(),
                    why: e.to_string(),
                })
            })
            .transpose()?;
        let mut config = match (&options.kubeconfig, &url) {
            (Some(path), _) => {
                let kubeconfig = Kubeconfig::read_from(path);
                let config = match kubeconfig {
                    Ok(kubeconfig) => {
                        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                            .await
                    }
                    Err(e) => Err(e),
                };
                config.map_err(|source| ApiSetupError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?
            }
            (None, Some(url)) => Config::new(url.clone()),
            (None, None) => Config::infer().await.map_err(ApiSetupError::Infer)?,
        };
        if let Some(url) = url {
            config.cluster_url = url;
        }
        let client = Client::try_from(config).map_err(ApiSetupError::Client)?;
        Ok(KubeApi {
            nodes: Api::all(client.clone()),
            client,
        })
    }
}

impl NodeApi for KubeApi {
    async fn node(&self, name: &str) -> Result<Node, ApiError> {
        self.nodes
            .get(name)
            .await
            .map_err(|e| api_error(format!("Node {name}"), e))
    }

    async fn pod_node(&self, namespace: &str, pod: &str) -> Result<Option<String>, ApiError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = pods
            .get(pod)
            .await
            .map_err(|e| api_error(format!("Pod {namespace}/{pod}"), e))?;
        Ok(pod.spec.and_then(|s| s.node_name))
    }

    async fn annotate(
        &self,
        node: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), ApiError> {
        // Through the status subresource, as flanneld: metadata changes
        // are taken there too, and its RBAC grants nodes/status patch, not
        // nodes patch.
        let patch = json!({"metadata": {"annotations": annotations}});
        self.nodes
            .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| api_error(format!("annotating Node {node}"), e))
    }

    async fn patch_status(&self, node: &str, patch: &serde_json::Value) -> Result<(), ApiError> {
        self.nodes
            .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .map(|_| ())
            .map_err(|e| api_error(format!("patching Node {node}'s status"), e))
    }

    fn watch(&self) -> NodeEvents {
        watcher::watcher(self.nodes.clone(), watcher::Config::default())
            .default_backoff()
            .map(|event| event.map_err(|e| ApiError::Failed(format!("watching Nodes: {e}"))))
            .boxed()
    }
}
