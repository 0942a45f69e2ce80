//! deploy/kubernetes/ and deploy/Containerfile: the manifests parse and
//! agree with each other, with the image and with the binaries' flags
//! (always run); a real kube-apiserver with RBAC accepts them, and the
//! ClusterRole allows calc-flannel exactly what it needs: it runs with the
//! ServiceAccount's token, and fails naming the permission when any one
//! rule is taken away (these need the API server testbed, else they skip
//! unless VXMGR_REQUIRE_KUBE=1).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::Daemon;
use support::kube::kube_available;
use support::netns::wait_until;
use support::testbed::kube::{Authorization, KubeApiServer, kubectl_binary};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn manifest_dir() -> PathBuf {
    repo().join("deploy/kubernetes")
}

/// Every object in deploy/kubernetes/, as JSON, with the file it is in.
fn objects() -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(manifest_dir())
        .expect("deploy/kubernetes/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifest in deploy/kubernetes/");
    let mut objects = Vec::new();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{name} is not YAML: {e}"));
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            for field in ["apiVersion", "kind"] {
                assert!(doc[field].is_string(), "{name}: an object without {field}");
            }
            assert!(
                doc["metadata"]["name"].is_string(),
                "{name}: a {} without a name",
                doc["kind"]
            );
            objects.push((name.clone(), doc));
        }
    }
    objects
}

/// The one object of `kind` (named `name`, when given).
fn find<'a>(objects: &'a [(String, Value)], kind: &str, name: Option<&str>) -> &'a Value {
    let found: Vec<&Value> = objects
        .iter()
        .map(|(_, o)| o)
        .filter(|o| o["kind"] == kind && name.is_none_or(|n| o["metadata"]["name"] == n))
        .collect();
    assert_eq!(found.len(), 1, "one {kind} {name:?} in the manifests");
    found[0]
}

fn str_of<'a>(value: &'a Value, what: &str) -> &'a str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("{what} is a string: {value}"))
}

fn pod_spec(objects: &[(String, Value)]) -> &Value {
    &find(objects, "DaemonSet", None)["spec"]["template"]["spec"]
}

/// The DaemonSet's init containers and containers.
fn containers(objects: &[(String, Value)]) -> Vec<&Value> {
    let spec = pod_spec(objects);
    ["initContainers", "containers"]
        .iter()
        .flat_map(|list| spec[list].as_array().into_iter().flatten())
        .collect()
}

fn container<'a>(objects: &'a [(String, Value)], name: &str) -> &'a Value {
    containers(objects)
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name} in the DaemonSet"))
}

/// A container's command and arguments.
fn command_line(container: &Value) -> Vec<&str> {
    ["command", "args"]
        .iter()
        .flat_map(|k| container[k].as_array().into_iter().flatten())
        .map(|a| str_of(a, "an argument"))
        .collect()
}

/// The value of `--flag=value` in a container's arguments.
fn flag<'a>(container: &'a Value, name: &str) -> &'a str {
    let prefix = format!("{name}=");
    command_line(container)
        .into_iter()
        .find_map(|a| a.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{} passes {name}=", container["name"]))
}

/// The binary of every `/usr/local/bin/NAME` a container runs or names.
fn binaries_named(container: &Value) -> BTreeSet<String> {
    command_line(container)
        .iter()
        .flat_map(|a| a.split_whitespace())
        .filter_map(|w| w.strip_prefix("/usr/local/bin/"))
        .map(|b| b.split(['/', '.']).next().unwrap().to_string())
        .filter(|b| !b.is_empty())
        .collect()
}

/// The `[[bin]]` names in Cargo.toml.
fn cargo_bins() -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let mut bins = BTreeSet::new();
    let mut in_bin = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin && let Some(value) = line.strip_prefix("name") {
            let name = value.trim_start().trim_start_matches('=').trim();
            bins.insert(name.trim_matches('"').to_string());
        }
    }
    bins
}

/// What deploy/Containerfile copies into /usr/local/bin/.
fn image_binaries() -> BTreeSet<String> {
    let containerfile = std::fs::read_to_string(repo().join("deploy/Containerfile")).unwrap();
    let mut copied = BTreeSet::new();
    for line in containerfile.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"COPY") && words.last() == Some(&"/usr/local/bin/") {
            copied.extend(words[1..words.len() - 1].iter().map(|w| w.to_string()));
        }
    }
    copied
}

/// What deploy/build-image puts in the build context (`for bin in ...`).
fn staged_binaries() -> BTreeSet<String> {
    let script = std::fs::read_to_string(repo().join("deploy/build-image")).unwrap();
    let line = script
        .lines()
        .find_map(|l| l.trim().strip_prefix("for bin in "))
        .expect("build-image copies the binaries with `for bin in ...`");
    line.trim_end_matches("; do")
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// This build's binary `name` (cargo builds every bin for integration tests).
fn built(name: &str) -> PathBuf {
    Path::new(support::VXMGRD).with_file_name(name)
}

#[test]
fn namespaced_objects_are_in_the_namespace_the_manifests_create() {
    let objects = objects();
    let namespace = find(&objects, "Namespace", None)["metadata"]["name"].clone();
    for (file, object) in &objects {
        let kind = &object["kind"];
        let cluster_scoped = ["Namespace", "ClusterRole", "ClusterRoleBinding"]
            .iter()
            .any(|k| kind == k);
        if cluster_scoped {
            assert!(object["metadata"]["namespace"].is_null(), "{file}: {kind}");
        } else {
            assert_eq!(object["metadata"]["namespace"], namespace, "{file}: {kind}");
        }
    }
}

#[test]
fn the_daemonset_names_objects_that_exist() {
    let objects = objects();
    let daemonset = find(&objects, "DaemonSet", None);
    let namespace = &daemonset["metadata"]["namespace"];
    let spec = pod_spec(&objects);

    let account = str_of(&spec["serviceAccountName"], "serviceAccountName");
    assert_eq!(
        find(&objects, "ServiceAccount", Some(account))["metadata"]["namespace"],
        *namespace
    );
    let binding = find(&objects, "ClusterRoleBinding", None);
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": account, "namespace": namespace}]),
        "the binding is the ServiceAccount's alone"
    );
    let role = str_of(&binding["roleRef"]["name"], "roleRef.name");
    assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
    find(&objects, "ClusterRole", Some(role));

    let selector = &daemonset["spec"]["selector"]["matchLabels"];
    let labels = &daemonset["spec"]["template"]["metadata"]["labels"];
    for (key, value) in selector.as_object().expect("matchLabels") {
        assert_eq!(
            &labels[key], value,
            "the pod template has the selector's {key}"
        );
    }

    // Each configMap volume's keys exist, and every file a container names
    // under the volume's mount path is one of its items.
    let volumes = spec["volumes"].as_array().expect("volumes");
    let mut checked = 0;
    for volume in volumes.iter().filter(|v| v["configMap"].is_object()) {
        let map_name = str_of(&volume["configMap"]["name"], "configMap.name");
        let data = &find(&objects, "ConfigMap", Some(map_name))["data"];
        let items = volume["configMap"]["items"].as_array().expect("items");
        let mut paths = BTreeSet::new();
        for item in items {
            let key = str_of(&item["key"], "an item's key");
            assert!(
                data[key].is_string(),
                "ConfigMap {map_name} has no key {key}"
            );
            paths.insert(str_of(&item["path"], "an item's path"));
        }
        for container in containers(&objects) {
            let mounts = container["volumeMounts"].as_array().into_iter().flatten();
            for mount in mounts.filter(|m| m["name"] == volume["name"]) {
                let dir = format!("{}/", str_of(&mount["mountPath"], "mountPath"));
                for word in command_line(container)
                    .iter()
                    .flat_map(|a| a.split([' ', '=', '\n']))
                {
                    if let Some(file) = word.strip_prefix(&dir) {
                        assert!(
                            paths.contains(file),
                            "{} reads {word}, not an item of {map_name}",
                            container["name"]
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(
        checked >= 2,
        "the CNI conflist and net-conf.json are read from the ConfigMap"
    );

    // Every volume a container mounts is declared.
    for container in containers(&objects) {
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let declared = volumes.iter().any(|v| v["name"] == mount["name"]);
            assert!(declared, "{}: {mount}", container["name"]);
        }
    }
}

#[test]
fn the_configmap_holds_the_network_and_the_cni_conflist() {
    let objects = objects();
    let map = find(&objects, "ConfigMap", None);
    let parse = |key: &str| -> Value {
        serde_json::from_str(str_of(&map["data"][key], key))
            .unwrap_or_else(|e| panic!("{key} is not JSON: {e}"))
    };
    assert_eq!(
        parse("net-conf.json"),
        json!({"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}})
    );
    let conflist = parse("cni-conf.json");
    assert_eq!(
        conflist,
        json!({"cniVersion": "0.3.1", "name": "cbr0", "plugins": [
            {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ]})
    );
    // The conflist's plugin is the binary the init container installs.
    let installed = binaries_named(container(&objects, "install-cni"));
    assert!(installed.contains("flannel"), "{installed:?}");
}

#[test]
fn the_image_holds_the_binaries_the_daemonset_runs() {
    let objects = objects();
    let bins = cargo_bins();
    let copied = image_binaries();
    assert!(!copied.is_empty(), "deploy/Containerfile copies no binary");
    for name in &copied {
        assert!(
            bins.contains(name),
            "the image's {name} is no [[bin]] of Cargo.toml {bins:?}"
        );
    }
    assert_eq!(
        staged_binaries(),
        copied,
        "build-image stages what the Containerfile copies"
    );

    let mut images = BTreeSet::new();
    for container in containers(&objects) {
        images.insert(str_of(&container["image"], "image"));
        for name in binaries_named(container) {
            assert!(
                copied.contains(&name),
                "{} runs {name}, not in the image",
                container["name"]
            );
        }
    }
    assert_eq!(images.len(), 1, "one image for all containers: {images:?}");
    for name in ["vxmgrd", "calc-flannel"] {
        assert_eq!(
            command_line(container(&objects, name))[0],
            format!("/usr/local/bin/{name}"),
            "container {name} runs {name}"
        );
    }
}

#[test]
fn every_flag_the_daemonset_passes_is_one_the_binary_takes() {
    let objects = objects();
    let mut checked = 0;
    for container in containers(&objects) {
        let line = command_line(container);
        let Some(bin) = line[0].strip_prefix("/usr/local/bin/") else {
            continue;
        };
        let output = Command::new(built(bin))
            .arg("--help")
            .output()
            .unwrap_or_else(|e| panic!("{bin} --help: {e}"));
        assert!(
            output.status.success(),
            "{bin} --help: {}",
            support::stderr(&output)
        );
        let help = String::from_utf8_lossy(&output.stdout);
        let offered: BTreeSet<&str> = help
            .split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[' || c == '<')
            .filter(|w| w.starts_with("--"))
            .collect();
        for arg in &line[1..] {
            let name = arg.split('=').next().unwrap();
            assert!(
                name.starts_with("--"),
                "{bin}: pass flags as --name=value: {arg}"
            );
            assert!(offered.contains(name), "{bin} has no {name}:\n{help}");
            checked += 1;
        }
    }
    assert!(checked > 0, "no flag checked");
}

#[test]
fn probes_and_the_socket_match_the_flags() {
    let objects = objects();
    let vxmgrd = container(&objects, "vxmgrd");
    let calc = container(&objects, "calc-flannel");
    // host:port of a container's probes.
    let probed = |c: &Value| -> BTreeSet<String> {
        ["livenessProbe", "readinessProbe"]
            .iter()
            .map(|p| {
                let get = &c[p]["httpGet"];
                assert!(get.is_object(), "{} has an HTTP {p}", c["name"]);
                format!("{}:{}", str_of(&get["host"], "probe host"), get["port"])
            })
            .collect()
    };
    assert_eq!(
        probed(vxmgrd),
        BTreeSet::from([flag(vxmgrd, "--http-listen").to_string()])
    );
    assert_eq!(
        probed(calc),
        BTreeSet::from([format!(
            "{}:{}",
            flag(calc, "--healthz-ip"),
            flag(calc, "--healthz-port")
        )])
    );

    // Both talk over the same socket, in a volume both mount there.
    let socket = Path::new(flag(vxmgrd, "--socket"));
    assert_eq!(socket, Path::new(flag(calc, "--socket")));
    let mount_of = |c: &Value| {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| Path::new(str_of(&m["mountPath"], "mountPath")) == socket.parent().unwrap())
            .map(|m| m["name"].clone())
            .unwrap_or_else(|| panic!("{} mounts no volume at the socket's directory", c["name"]))
    };
    assert_eq!(mount_of(vxmgrd), mount_of(calc));

    // vxmgrd's hostname is the Node's name, which calc-flannel names its
    // tunnel endpoint by.
    let variable = flag(vxmgrd, "--hostname")
        .strip_prefix("$(")
        .and_then(|v| v.strip_suffix(')'))
        .expect("--hostname=$(VARIABLE)");
    for c in [vxmgrd, calc] {
        let env = c["env"].as_array().expect("env");
        let node_name = env.iter().find(|e| e["name"] == variable);
        assert_eq!(
            node_name.map(|e| &e["valueFrom"]["fieldRef"]["fieldPath"]),
            Some(&json!("spec.nodeName")),
            "{}: {variable} is the Node's name",
            c["name"]
        );
    }
}

/// What calc-flannel --kube-subnet-mgr does in the API, as (resource,
/// verb): flanneld v0.20's ClusterRole.
const NEEDED: [(&str, &str); 5] = [
    ("pods", "get"),
    ("nodes", "get"),
    ("nodes", "list"),
    ("nodes", "watch"),
    ("nodes/status", "patch"),
];

/// (resource, verb) of every rule of a ClusterRole, all in the core group.
fn grants(role: &Value) -> BTreeSet<(String, String)> {
    let mut grants = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        assert_eq!(
            rule["apiGroups"],
            json!([""]),
            "only the core group: {rule}"
        );
        for resource in rule["resources"].as_array().expect("resources") {
            for verb in rule["verbs"].as_array().expect("verbs") {
                grants.insert((
                    str_of(resource, "resource").to_string(),
                    str_of(verb, "verb").to_string(),
                ));
            }
        }
    }
    grants
}

#[test]
fn the_clusterrole_grants_exactly_what_calc_flannel_needs() {
    let objects = objects();
    let needed: BTreeSet<(String, String)> = NEEDED
        .iter()
        .map(|(r, v)| (r.to_string(), v.to_string()))
        .collect();
    assert_eq!(grants(find(&objects, "ClusterRole", None)), needed);
}

/// A manifest file by name, to hand to kubectl.
fn manifest(file: &str) -> String {
    manifest_dir().join(file).to_string_lossy().into_owned()
}

/// A kube-apiserver on loopback that authorizes by RBAC.
fn api_server(dir: &Path) -> KubeApiServer {
    KubeApiServer::start(None, "127.0.0.1", dir, Authorization::Rbac)
        .expect("the API server starts")
}

/// The API server with RBAC, the namespace and the RBAC objects applied for
/// real, and the ServiceAccount's kubeconfig.
struct Cluster {
    dir: tempfile::TempDir,
    server: KubeApiServer,
    objects: Vec<(String, Value)>,
    kubeconfig: PathBuf,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let server = api_server(dir.path());
        let objects = objects();
        for file in ["00-namespace.yaml", "10-rbac.yaml"] {
            server
                .kubectl(&["apply", "-f", &manifest(file)])
                .expect(file);
        }
        let account = find(&objects, "ServiceAccount", None);
        let token = server
            .service_account_token(
                str_of(&account["metadata"]["namespace"], "namespace"),
                str_of(&account["metadata"]["name"], "name"),
            )
            .expect("a token of the ServiceAccount");
        let kubeconfig = dir.path().join("calc-flannel.kubeconfig");
        server.write_kubeconfig(&kubeconfig, &token).unwrap();
        Cluster {
            dir,
            server,
            objects,
            kubeconfig,
        }
    }

    fn namespace(&self) -> &str {
        str_of(
            &find(&self.objects, "Namespace", None)["metadata"]["name"],
            "namespace",
        )
    }

    /// `kubectl auth can-i` as the ServiceAccount.
    fn can(&self, verb: &str, resource: &str) -> bool {
        let (resource, subresource) = match resource.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (resource, None),
        };
        let mut command = Command::new(kubectl_binary().unwrap());
        command.arg("--kubeconfig").arg(&self.kubeconfig).args([
            "auth",
            "can-i",
            verb,
            resource,
            "--all-namespaces",
        ]);
        if let Some(subresource) = subresource {
            command.arg(format!("--subresource={subresource}"));
        }
        let output = command.output().expect("kubectl runs");
        let answer = String::from_utf8_lossy(&output.stdout).trim().to_string();
        match (output.status.code(), answer.as_str()) {
            (Some(0), "yes") => true,
            (Some(1), "no") => false,
            _ => panic!(
                "kubectl auth can-i {verb} {resource}: {answer} {}",
                support::stderr(&output)
            ),
        }
    }

    /// Applies the manifests' ClusterRole without `verb` on `resource`
    /// (`None`: as it is), and waits until the authorizer answers so.
    fn apply_role_without(&self, taken: Option<(&str, &str)>) {
        let mut role = find(&self.objects, "ClusterRole", None).clone();
        if let Some((resource, verb)) = taken {
            for rule in role["rules"].as_array_mut().unwrap() {
                if rule["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r == resource)
                {
                    rule["verbs"].as_array_mut().unwrap().retain(|v| v != verb);
                }
            }
            // A rule must have a verb.
            role["rules"]
                .as_array_mut()
                .unwrap()
                .retain(|rule| rule["verbs"].as_array().is_some_and(|v| !v.is_empty()));
        }
        self.server
            .kubectl_stdin(&["apply", "-f", "-"], &role.to_string())
            .expect("apply the ClusterRole");
        for (resource, verb) in NEEDED {
            let allowed = taken != Some((resource, verb));
            wait_until(&format!("{verb} {resource} allowed: {allowed}"), || {
                self.can(verb, resource) == allowed
            });
        }
    }
}

#[test]
fn the_api_server_accepts_every_manifest() {
    if !kube_available("the_api_server_accepts_every_manifest") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = api_server(dir.path());
    // Namespaced objects are admitted only into a namespace that exists,
    // dry run or not: it is the one object created for real.
    server
        .kubectl(&["apply", "-f", &manifest("00-namespace.yaml")])
        .expect("the namespace is created");
    let folder = manifest_dir().to_string_lossy().into_owned();
    let output = server
        .kubectl(&["apply", "--dry-run=server", "-f", &folder])
        .expect("the API server accepts every manifest");
    for (file, object) in objects() {
        let kind = str_of(&object["kind"], "kind").to_lowercase();
        let name = str_of(&object["metadata"]["name"], "name");
        // `daemonset.apps/vxmgr-flannel created (server dry run)`
        let reported = output.lines().any(|l| {
            l.split_once('/').is_some_and(|(k, rest)| {
                (k == kind || k.starts_with(&format!("{kind}.")))
                    && rest.starts_with(&format!("{name} "))
                    && rest.ends_with("(server dry run)")
            })
        });
        assert!(
            reported,
            "{file}: {kind} {name} not in kubectl's answer:\n{output}"
        );
    }
    // A dry run leaves nothing behind.
    let daemonsets = server
        .kubectl(&["get", "daemonsets", "--all-namespaces", "-o", "name"])
        .unwrap();
    assert_eq!(daemonsets.trim(), "", "the dry run created {daemonsets}");
}

#[test]
fn the_serviceaccount_may_do_what_calc_flannel_needs_and_nothing_else() {
    if !kube_available("the_serviceaccount_may_do_what_calc_flannel_needs_and_nothing_else") {
        return;
    }
    let cluster = Cluster::start();
    for (resource, verb) in NEEDED {
        assert!(cluster.can(verb, resource), "{verb} {resource} is allowed");
    }
    for (resource, verb) in [
        ("nodes", "patch"),
        ("nodes", "update"),
        ("nodes", "delete"),
        ("nodes/status", "update"),
        ("pods", "list"),
        ("pods", "create"),
        ("secrets", "get"),
        ("secrets", "list"),
        ("configmaps", "get"),
        ("serviceaccounts/token", "create"),
    ] {
        assert!(!cluster.can(verb, resource), "{verb} {resource} is denied");
    }
}

/// The flannel annotations calc-flannel writes on its Node.
const PREFIX: &str = "flannel.alpha.coreos.com";

/// A Node as the controller manager leaves it: its pod CIDR allocated;
/// with `lease`, another node's calc-flannel has written its annotations.
fn node(name: &str, cidr: &str, lease: Option<(&str, &str)>) -> Value {
    let annotations = match lease {
        Some((public_ip, vtep_mac)) => json!({
            format!("{PREFIX}/backend-type"): "vxlan",
            format!("{PREFIX}/backend-data"): json!({"VNI": 1, "VtepMAC": vtep_mac}).to_string(),
            format!("{PREFIX}/public-ip"): public_ip,
            format!("{PREFIX}/kube-subnet-manager"): "true",
        }),
        None => json!({}),
    };
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
    })
}

/// calc-flannel as the DaemonSet runs it, with the ServiceAccount's
/// kubeconfig; stopped when dropped.
struct CalcFlannel {
    child: Child,
    log: PathBuf,
}

impl CalcFlannel {
    /// The DaemonSet's arguments, with the paths and the health port of
    /// this test; `env` names the node (NODE_NAME, or POD_NAME and
    /// POD_NAMESPACE).
    fn start(cluster: &Cluster, daemon: &Daemon, run: &str, env: &[(&str, &str)]) -> CalcFlannel {
        let dir = cluster.dir.path();
        let net_conf = dir.join("net-conf.json");
        let map = find(&cluster.objects, "ConfigMap", None);
        std::fs::write(
            &net_conf,
            str_of(&map["data"]["net-conf.json"], "net-conf.json"),
        )
        .unwrap();
        let container = container(&cluster.objects, "calc-flannel");
        let ours = |arg: &str| match arg.split_once('=') {
            Some(("--net-config-path", _)) => format!("--net-config-path={}", net_conf.display()),
            Some(("--socket", _)) => format!("--socket={}", daemon.socket.display()),
            Some(("--healthz-port", _)) => "--healthz-port=0".to_string(),
            _ => arg.to_string(),
        };
        let args: Vec<String> = command_line(container)[1..]
            .iter()
            .map(|a| ours(a))
            .collect();
        let log = dir.join(format!("calc-flannel-{run}.log"));
        let child = Command::new(built("calc-flannel"))
            .args(&args)
            .arg(format!(
                "--kubeconfig-file={}",
                cluster.kubeconfig.display()
            ))
            .arg(format!(
                "--subnet-file={}",
                dir.join("subnet.env").display()
            ))
            .env_remove("NODE_NAME")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .envs(env.iter().copied())
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("calc-flannel starts");
        CalcFlannel { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls `done` (given calc-flannel's log) for up to 30 s; fails with
    /// the log when calc-flannel ends first or time runs out.
    fn wait_for(&mut self, what: &str, mut done: impl FnMut(&str) -> bool) {
        let start = Instant::now();
        loop {
            let exited = self.child.try_wait().expect("calc-flannel's status");
            let log = self.log();
            if done(&log) {
                return;
            }
            if let Some(status) = exited {
                panic!("calc-flannel ended ({status}) before {what}:\n{log}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "timed out waiting for {what}; calc-flannel:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops calc-flannel and reads all it logged: for checks that
    /// something was never logged.
    fn stop_and_read_log(&mut self) -> String {
        let _ = self.child.kill();
        self.child.wait().expect("calc-flannel's status");
        std::fs::read_to_string(&self.log).expect("calc-flannel's log")
    }
}

impl Drop for CalcFlannel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Node's annotations.
fn annotations(server: &KubeApiServer, name: &str) -> BTreeMap<String, String> {
    let node: Value = serde_json::from_str(
        &server
            .kubectl(&["get", "node", name, "-o", "json"])
            .unwrap(),
    )
    .unwrap();
    serde_json::from_value(node["metadata"]["annotations"].clone()).unwrap_or_default()
}

#[test]
fn calc_flannel_runs_with_the_clusterrole_and_fails_without_any_of_its_rules() {
    if !kube_available("calc_flannel_runs_with_the_clusterrole_and_fails_without_any_of_its_rules")
    {
        return;
    }
    let cluster = Cluster::start();
    let server = &cluster.server;
    for node in [
        node("node-a", "10.244.0.0/24", None),
        node(
            "node-b",
            "10.244.1.0/24",
            Some(("198.51.100.2", "66:aa:00:00:00:02")),
        ),
    ] {
        server
            .kubectl_stdin(&["apply", "-f", "-"], &node.to_string())
            .expect("create the Node");
    }
    // calc-flannel's own Pod, for finding its Node without NODE_NAME.
    let namespace = cluster.namespace().to_string();
    let account = str_of(&pod_spec(&cluster.objects)["serviceAccountName"], "account");
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "vxmgr-flannel-test", "namespace": namespace},
        "spec": {
            "nodeName": "node-a",
            "serviceAccountName": account,
            "automountServiceAccountToken": false,
            "containers": [{"name": "calc-flannel", "image": "localhost/vxmgr:latest"}],
        },
    });
    server
        .kubectl_stdin(&["apply", "-f", "-"], &pod.to_string())
        .expect("create the Pod");

    // The whole ClusterRole: node-a's lease annotations are written and
    // node-b's subnet is routed through its tunnel endpoint.
    let daemon = Daemon::memory(&[]);
    {
        let mut calc = CalcFlannel::start(&cluster, &daemon, "whole", &[("NODE_NAME", "node-a")]);
        calc.wait_for("calc-flannel annotates node-a", |_| {
            let written = annotations(server, "node-a");
            written.get(&format!("{PREFIX}/kube-subnet-manager")) == Some(&"true".to_string())
                && written.contains_key(&format!("{PREFIX}/backend-data"))
                && written.contains_key(&format!("{PREFIX}/public-ip"))
        });
        let runtime = tokio::runtime::Runtime::new().unwrap();
        calc.wait_for("vxmgrd routes node-b's subnet to its VTEP", |_| {
            let state = runtime.block_on(daemon.state());
            state.ipv4.is_some_and(|v4| {
                v4.tunnel_routes.iter().any(|r| r.dst == "10.244.1.0/24")
                    && v4
                        .remote_vteps
                        .iter()
                        .any(|v| v.mac == "66:aa:00:00:00:02" && v.parent_address == "198.51.100.2")
            })
        });
        let log = calc.stop_and_read_log();
        assert!(!log.contains("orbidden"), "{log}");
    }

    // Any one rule taken away: calc-flannel names what it was refused.
    for (resource, verb) in NEEDED {
        cluster.apply_role_without(Some((resource, verb)));
        // The annotations are to be written again.
        let written: Vec<String> = annotations(server, "node-a")
            .into_keys()
            .filter(|k| k.starts_with(PREFIX))
            .map(|k| format!("{k}-"))
            .collect();
        if !written.is_empty() {
            let mut annotate = vec!["annotate", "node", "node-a"];
            annotate.extend(written.iter().map(String::as_str));
            server
                .kubectl(&annotate)
                .expect("remove node-a's annotations");
        }
        let env: &[(&str, &str)] = if resource == "pods" {
            &[
                ("POD_NAME", "vxmgr-flannel-test"),
                ("POD_NAMESPACE", &namespace),
            ]
        } else {
            &[("NODE_NAME", "node-a")]
        };
        let run = format!("without-{verb}-{}", resource.replace('/', "-"));
        let mut calc = CalcFlannel::start(&cluster, &daemon, &run, env);
        let refusal = format!("cannot {verb} resource \"{resource}\"");
        calc.wait_for(&format!("calc-flannel reports {refusal}"), |log| {
            log.contains(&refusal)
        });
        drop(calc);
        cluster.apply_role_without(None);
    }
}

/// The image to check, named by VXMGR_IMAGE (deploy/build-image's); a test
/// without it skips, unless VXMGR_REQUIRE_IMAGE is 1 or true.
fn image_under_test(test: &str) -> Option<String> {
    if let Some(image) = std::env::var("VXMGR_IMAGE").ok().filter(|i| !i.is_empty()) {
        return Some(image);
    }
    support::require::skip(
        test,
        "IMAGE",
        "needs VXMGR_IMAGE=<an image made by deploy/build-image> and podman",
    );
    None
}

/// `podman run --rm <args>`: its output, which must be a success.
fn podman_run(args: &[&str]) -> String {
    let output = Command::new("podman")
        .args(["run", "--rm"])
        .args(args)
        .output()
        .expect("podman runs (apt-get install podman)");
    assert!(
        output.status.success(),
        "podman run {}: {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        support::stderr(&output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_image_runs_the_binaries_and_holds_the_tools_vxmgrd_calls() {
    let Some(image) =
        image_under_test("the_image_runs_the_binaries_and_holds_the_tools_vxmgrd_calls")
    else {
        return;
    };
    let objects = objects();
    for name in ["vxmgrd", "calc-flannel", "calc-stub"] {
        let version = podman_run(&[&image, name, "--version"]);
        assert!(version.starts_with(name), "{name} --version: {version}");
    }
    // The CNI plugin speaks the conflist's CNI version.
    let conflist: Value = serde_json::from_str(str_of(
        &find(&objects, "ConfigMap", None)["data"]["cni-conf.json"],
        "cni-conf.json",
    ))
    .unwrap();
    // VERSION reads the caller's version from stdin, as every command does.
    let version = json!({"cniVersion": conflist["cniVersion"]}).to_string();
    let answer: Value = serde_json::from_str(&podman_run(&[
        "--env=CNI_COMMAND=VERSION",
        &image,
        "sh",
        "-c",
        &format!("echo '{version}' | /usr/local/bin/flannel"),
    ]))
    .expect("the plugin answers VERSION with JSON");
    assert!(
        answer["supportedVersions"]
            .as_array()
            .is_some_and(|v| v.contains(&conflist["cniVersion"])),
        "{answer}"
    );
    let tools = "ipset nft iptables-nft-save iptables-nft-restore iptables-legacy-save \
                 iptables-legacy-restore ip6tables-nft-save ip6tables-nft-restore \
                 ip6tables-legacy-save ip6tables-legacy-restore ip sh cp mv";
    podman_run(&[
        &image,
        "sh",
        "-ec",
        &format!("for t in {tools}; do command -v $t; done"),
    ]);
}

#[test]
fn the_init_container_installs_the_plugin_and_the_conflist() {
    let Some(image) = image_under_test("the_init_container_installs_the_plugin_and_the_conflist")
    else {
        return;
    };
    let objects = objects();
    let init = container(&objects, "install-cni");
    let dir = tempfile::tempdir().unwrap();
    // The host paths and the ConfigMap, mounted where the DaemonSet mounts them.
    let volumes = pod_spec(&objects)["volumes"].as_array().unwrap();
    let mut mounts = Vec::new();
    for mount in init["volumeMounts"].as_array().unwrap() {
        let name = str_of(&mount["name"], "volume name");
        let source = dir.path().join(name);
        std::fs::create_dir(&source).unwrap();
        let volume = volumes.iter().find(|v| v["name"] == name).unwrap();
        if let Some(map) = volume["configMap"]["name"].as_str() {
            let data = &find(&objects, "ConfigMap", Some(map))["data"];
            for item in volume["configMap"]["items"].as_array().unwrap() {
                let text = str_of(&data[str_of(&item["key"], "key")], "ConfigMap value");
                std::fs::write(source.join(str_of(&item["path"], "path")), text).unwrap();
            }
        }
        mounts.push(format!(
            "--volume={}:{}",
            source.display(),
            str_of(&mount["mountPath"], "mountPath")
        ));
    }
    let line = command_line(init);
    let mut args: Vec<&str> = mounts.iter().map(String::as_str).collect();
    args.extend(["--cap-drop=all", "--entrypoint", line[0], &image]);
    args.extend(&line[1..]);
    podman_run(&args);

    let conflist = std::fs::read_to_string(dir.path().join("cni/10-flannel.conflist")).unwrap();
    assert_eq!(
        conflist,
        str_of(
            &find(&objects, "ConfigMap", None)["data"]["cni-conf.json"],
            "cni-conf.json"
        )
    );
    let plugin = std::fs::read(dir.path().join("cni-plugin/flannel")).unwrap();
    let in_image = Command::new("podman")
        .args(["run", "--rm", &image, "cat", "/usr/local/bin/flannel"])
        .output()
        .unwrap()
        .stdout;
    assert!(plugin == in_image, "the installed plugin is the image's");
    let left: Vec<_> = std::fs::read_dir(dir.path().join("cni-plugin"))
        .unwrap()
        .chain(std::fs::read_dir(dir.path().join("cni")).unwrap())
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 2, "no temporary file left: {left:?}");
}

/// vxmgrd as the DaemonSet runs it (its arguments, a read-only root, only
/// the DaemonSet's capabilities) in a network namespace of its own with a
/// veth as the underlay: a two-node view with a masquerading pool applies
/// cleanly, through the image's ipset, nft and iptables.
#[test]
fn vxmgrd_programs_the_kernel_in_the_image_with_the_daemonsets_privileges() {
    let Some(image) =
        image_under_test("vxmgrd_programs_the_kernel_in_the_image_with_the_daemonsets_privileges")
    else {
        return;
    };
    let objects = objects();
    let vxmgrd = container(&objects, "vxmgrd");
    let capabilities = vxmgrd["securityContext"]["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| str_of(c, "capability"))
        .collect::<Vec<_>>()
        .join(",");
    assert_eq!(
        vxmgrd["securityContext"]["readOnlyRootFilesystem"], true,
        "the test runs vxmgrd on a read-only root as the DaemonSet does"
    );
    let daemon: Vec<String> = command_line(vxmgrd)
        .iter()
        .map(|a| a.replace("$(NODE_NAME)", "node-a"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut view = std::fs::read_to_string(repo().join("tests/replays/two-nodes.jsonl")).unwrap();
    view = view.replace(
        "{\"inSync\": {}}",
        "{\"ipamPoolUpdate\": {\"id\": \"net\", \"pool\": {\"cidr\": \"10.244.0.0/16\", \
         \"masquerade\": true, \"vxlanMode\": \"Always\"}}}\n{\"inSync\": {}}",
    );
    std::fs::write(dir.path().join("view.jsonl"), view).unwrap();
    let socket = flag(vxmgrd, "--socket");
    let script = format!(
        "ip link add eth0 type veth peer name eth1
         ip addr add 192.168.10.1/24 dev eth0
         ip link set eth0 up; ip link set eth1 up
         {daemon} 2>/view/vxmgrd.log &
         for i in $(seq 300); do [ -S {socket} ] && break; sleep 0.1; done
         calc-stub replay --socket {socket} --timeout 60s /view/view.jsonl
         ip -d link show vxlan.calico; ip route; ipset list cali40all-vxlan-net
         nft list table inet vxmgr
         iptables-legacy-save -t filter; iptables-nft-save -t filter",
        daemon = daemon.join(" "),
    );
    let output = Command::new("podman")
        .args([
            "run",
            "--rm",
            "--network=none",
            "--read-only",
            "--cap-drop=all",
        ])
        .arg(format!("--cap-add={capabilities}"))
        .arg(format!("--volume={}:/view", dir.path().display()))
        .args([&image, "sh", "-ec", &script])
        .output()
        .expect("podman runs");
    // podman has returned: vxmgrd, inside, is done writing its log.
    let log = std::fs::read_to_string(dir.path().join("vxmgrd.log"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}\nvxmgrd:\n{log:?}",
        support::stderr(&output)
    );
    let log = log.expect("vxmgrd.log");
    for shown in [
        "vxlan id 4096",
        "10.244.1.0/26 via 10.244.1.0 dev vxlan.calico",
        "blackhole 10.244.0.0/26 proto 80",
        "192.168.10.2",
        "masquerade",
        "-A FORWARD -j VXMGR-FORWARD",
    ] {
        assert!(
            stdout.contains(shown),
            "{shown:?} not in:\n{stdout}\nvxmgrd:\n{log}"
        );
    }
    assert!(!log.contains("ERROR"), "{log}");
}
