//! Command-line flags, flannel's names where flannel has the flag. Every
//! flag can also be set as `CALC_FLANNEL_<FLAG>`, and flannel's as flanneld's
//! `FLANNELD_<FLAG>` too (the first wins); the socket also as vxmgrd's
//! `VXMGR_SOCKET`. In kube mode, this node's Node comes from flanneld's
//! `NODE_NAME`, or `POD_NAMESPACE`/`POD_NAME`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};
use regex::Regex;

use crate::registry::kube::NodeIdentity;

#[derive(Parser, Debug)]
#[command(name = "calc-flannel", version)]
/// flannel's subnet manager as a calc process for vxmgrd: holds this node's
/// lease of the network, follows the other nodes' leases and streams routes
/// and tunnel endpoints to vxmgrd.
///
/// Two modes, as flanneld: on etcd (the default: leases are keys under
/// --etcd-prefix, created and renewed by each node), or with
/// --kube-subnet-mgr on the Kubernetes API (the lease is this node's Node's
/// podCIDR, published in flannel's Node annotations; the network config is
/// --net-config-path).
pub struct Cli {
    /// Use the Kubernetes API instead of etcd (flanneld's kube subnet
    /// manager).
    #[arg(long, env = "CALC_FLANNEL_KUBE_SUBNET_MGR")]
    pub kube_subnet_mgr: bool,
    /// kubeconfig for the Kubernetes API (default: in-cluster config, or
    /// KUBECONFIG).
    #[arg(long, env = "CALC_FLANNEL_KUBECONFIG_FILE")]
    pub kubeconfig_file: Option<PathBuf>,
    /// The Kubernetes API server's URL (overrides the kubeconfig's).
    #[arg(long, env = "CALC_FLANNEL_KUBE_API_URL")]
    pub kube_api_url: Option<String>,
    /// Prefix of flannel's Node annotations.
    #[arg(
        long,
        env = "CALC_FLANNEL_KUBE_ANNOTATION_PREFIX",
        default_value = "flannel.alpha.coreos.com"
    )]
    pub kube_annotation_prefix: String,
    /// The network config in kube mode (flannel's net-conf.json).
    #[arg(
        long,
        env = "CALC_FLANNEL_NET_CONFIG_PATH",
        default_value = "/etc/kube-flannel/net-conf.json"
    )]
    pub net_config_path: PathBuf,
    /// In kube mode, set the Node's NetworkUnavailable condition false once
    /// vxmgrd has programmed the node.
    #[arg(
        long,
        env = "CALC_FLANNEL_SET_NODE_NETWORK_UNAVAILABLE",
        default_value_t = true,
        action = ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        require_equals = true
    )]
    pub set_node_network_unavailable: bool,
    /// Address of the health and metrics listener.
    #[arg(long, env = "CALC_FLANNEL_HEALTHZ_IP", default_value = "0.0.0.0")]
    pub healthz_ip: IpAddr,
    /// Port of the health and metrics listener (/healthz, /livez, /readyz,
    /// /metrics); 0: none.
    #[arg(long, env = "CALC_FLANNEL_HEALTHZ_PORT", default_value_t = 0)]
    pub healthz_port: u16,
    /// etcd endpoints (http:// or https://), comma-separated or repeated.
    #[arg(
        long,
        env = "CALC_FLANNEL_ETCD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    pub etcd_endpoints: Vec<String>,
    /// The etcd prefix of the network config and leases.
    #[arg(
        long,
        env = "CALC_FLANNEL_ETCD_PREFIX",
        default_value = "/coreos.com/network"
    )]
    pub etcd_prefix: String,
    /// CA certificate (PEM) that signs the etcd servers' certificates.
    #[arg(long, env = "CALC_FLANNEL_ETCD_CAFILE")]
    pub etcd_cafile: Option<PathBuf>,
    /// Client certificate (PEM) for etcd.
    #[arg(long, env = "CALC_FLANNEL_ETCD_CERTFILE")]
    pub etcd_certfile: Option<PathBuf>,
    /// Client certificate key (PEM) for etcd.
    #[arg(long, env = "CALC_FLANNEL_ETCD_KEYFILE")]
    pub etcd_keyfile: Option<PathBuf>,
    #[arg(long, env = "CALC_FLANNEL_ETCD_USERNAME")]
    pub etcd_username: Option<String>,
    #[arg(long, env = "CALC_FLANNEL_ETCD_PASSWORD", hide_env_values = true)]
    pub etcd_password: Option<String>,
    /// Interface (name or address) to use, repeatable: the first usable wins.
    #[arg(long, env = "CALC_FLANNEL_IFACE", value_delimiter = ',')]
    pub iface: Vec<String>,
    /// Regular expression matched against addresses, then interface names
    /// (when no --iface is given), repeatable.
    #[arg(long, env = "CALC_FLANNEL_IFACE_REGEX", value_delimiter = ',')]
    pub iface_regex: Vec<Regex>,
    /// IPv4 address other nodes reach this one at (default: the interface's).
    #[arg(long, env = "CALC_FLANNEL_PUBLIC_IP")]
    pub public_ip: Option<Ipv4Addr>,
    /// IPv6 address other nodes reach this one at (default: the interface's).
    #[arg(long, env = "CALC_FLANNEL_PUBLIC_IPV6")]
    pub public_ipv6: Option<Ipv6Addr>,
    /// Where the subnet file for CNI plugins is written.
    #[arg(
        long,
        env = "CALC_FLANNEL_SUBNET_FILE",
        default_value = "/run/flannel/subnet.env"
    )]
    pub subnet_file: PathBuf,
    /// Renew the lease this long before it expires: minutes, as flannel's
    /// flag takes it, or a duration ("90s").
    #[arg(
        long,
        env = "CALC_FLANNEL_SUBNET_LEASE_RENEW_MARGIN",
        default_value = "60",
        value_parser = parse_minutes
    )]
    pub subnet_lease_renew_margin: Duration,
    /// How long a lease lives without renewal (flannel's is 24 h; shorter
    /// only to see expiry happen, e.g. in tests).
    #[arg(
        long,
        env = "CALC_FLANNEL_SUBNET_LEASE_TTL",
        default_value = "24h",
        value_parser = humantime::parse_duration
    )]
    pub subnet_lease_ttl: Duration,
    /// Masquerade the pods' traffic to outside the network, as flannel's
    /// --ip-masq: vxmgrd gets the network as a masquerading IP pool.
    #[arg(long, env = "CALC_FLANNEL_IP_MASQ")]
    pub ip_masq: bool,
    /// vxmgrd's unix socket.
    #[arg(
        long,
        env = "CALC_FLANNEL_SOCKET",
        default_value = "/run/vxmgr/dataplane.sock"
    )]
    pub socket: PathBuf,
    /// Log filter (tracing's syntax).
    #[arg(long, env = "CALC_FLANNEL_LOG", default_value = "info")]
    pub log: String,
}

/// The flags flannel has, by the suffix of their variables.
const FLANNEL_FLAGS: &[&str] = &[
    "ETCD_ENDPOINTS",
    "ETCD_PREFIX",
    "ETCD_CAFILE",
    "ETCD_CERTFILE",
    "ETCD_KEYFILE",
    "ETCD_USERNAME",
    "ETCD_PASSWORD",
    "IFACE",
    "IFACE_REGEX",
    "PUBLIC_IP",
    "PUBLIC_IPV6",
    "SUBNET_FILE",
    "IP_MASQ",
    "SUBNET_LEASE_RENEW_MARGIN",
    "KUBE_SUBNET_MGR",
    "KUBECONFIG_FILE",
    "KUBE_API_URL",
    "KUBE_ANNOTATION_PREFIX",
    "NET_CONFIG_PATH",
    "SET_NODE_NETWORK_UNAVAILABLE",
    "HEALTHZ_IP",
    "HEALTHZ_PORT",
];

/// The other variable a flag answers to.
fn alias(variable: &str) -> Option<String> {
    let flag = variable.strip_prefix("CALC_FLANNEL_")?;
    if flag == "SOCKET" {
        return Some("VXMGR_SOCKET".into());
    }
    FLANNEL_FLAGS
        .contains(&flag)
        .then(|| format!("FLANNELD_{flag}"))
}

fn parse_minutes(v: &str) -> Result<Duration, String> {
    match v.parse::<u64>() {
        Ok(minutes) => Ok(Duration::from_secs(minutes * 60)),
        Err(_) => humantime::parse_duration(v).map_err(|e| format!("minutes or a duration: {e}")),
    }
}

/// The flags to be read from their alias instead: a flag's own variable
/// wins; when it is unset and its alias is set, the alias is read.
fn aliases_in_effect(
    command: &clap::Command,
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Vec<(String, String)> {
    command
        .get_arguments()
        .filter_map(|a| {
            let variable = a.get_env()?.to_str()?;
            let alias = alias(variable)?;
            (var(variable).is_none() && var(&alias).is_some())
                .then(|| (a.get_id().to_string(), alias))
        })
        .collect()
}

impl Cli {
    /// Parses the command line and the environment.
    pub fn parse_all() -> Cli {
        Cli::from_env(std::env::args_os(), |name| std::env::var_os(name))
    }

    fn from_env(
        args: impl IntoIterator<Item = std::ffi::OsString>,
        var: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Cli {
        let mut command = Cli::command();
        for (id, alias) in aliases_in_effect(&command, var) {
            command = command.mut_arg(id, |a| a.env(alias));
        }
        let matches = command.get_matches_from(args);
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }

    /// Checks what flags cannot check one by one.
    pub fn check(&self) -> Result<(), String> {
        if self.subnet_lease_renew_margin >= self.subnet_lease_ttl {
            return Err(format!(
                "--subnet-lease-renew-margin ({}) must be shorter than --subnet-lease-ttl ({})",
                humantime::format_duration(self.subnet_lease_renew_margin),
                humantime::format_duration(self.subnet_lease_ttl)
            ));
        }
        Ok(())
    }

    /// Where the health listener listens, if anywhere.
    pub fn healthz_address(&self) -> Option<SocketAddr> {
        (self.healthz_port != 0).then(|| SocketAddr::new(self.healthz_ip, self.healthz_port))
    }
}

/// This node's Node, from flanneld's variables.
pub fn node_identity(var: impl Fn(&str) -> Option<String>) -> Result<NodeIdentity, &'static str> {
    let set = |name| var(name).filter(|v| !v.is_empty());
    if let Some(name) = set("NODE_NAME") {
        return Ok(NodeIdentity::Name(name));
    }
    match (set("POD_NAMESPACE"), set("POD_NAME")) {
        (Some(namespace), Some(name)) => Ok(NodeIdentity::Pod { namespace, name }),
        _ => Err(
            "--kube-subnet-mgr needs this node's Node: set NODE_NAME, or POD_NAME and POD_NAMESPACE",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flannel_variables_and_vxmgr_socket_are_aliases_and_lose_to_our_own() {
        let set = [
            "FLANNELD_IFACE",
            "FLANNELD_ETCD_PREFIX",
            "CALC_FLANNEL_ETCD_PREFIX",
            "VXMGR_SOCKET",
            "FLANNELD_LOG",
        ];
        let var = |name: &str| set.contains(&name).then(|| "x".into());
        let mut aliases = aliases_in_effect(&Cli::command(), var);
        aliases.sort();
        assert_eq!(
            aliases,
            [
                ("iface".to_string(), "FLANNELD_IFACE".to_string()),
                ("socket".to_string(), "VXMGR_SOCKET".to_string()),
            ]
        );
    }

    #[test]
    fn help_says_what_calc_flannel_is_in_both_modes() {
        let help = Cli::command().render_help().to_string();
        assert!(
            help.starts_with("flannel's subnet manager as a calc process for vxmgrd"),
            "{help}"
        );
        let long = Cli::command().render_long_help().to_string();
        assert!(
            long.contains("--kube-subnet-mgr on the Kubernetes API"),
            "{long}"
        );
        assert!(!help.contains(env!("CARGO_PKG_DESCRIPTION")), "{help}");
    }

    #[test]
    fn kube_flags_parse_as_flanneld_takes_them() {
        let cli = Cli::from_env(
            [
                "calc-flannel",
                "--kube-subnet-mgr",
                "--set-node-network-unavailable=false",
                "--healthz-port",
                "8285",
            ]
            .map(Into::into),
            |_| None,
        );
        assert!(cli.kube_subnet_mgr);
        assert!(!cli.set_node_network_unavailable);
        let var = |name: &str| (name == "FLANNELD_KUBE_ANNOTATION_PREFIX").then(|| "x".into());
        assert_eq!(
            aliases_in_effect(&Cli::command(), var),
            [(
                "kube_annotation_prefix".to_string(),
                "FLANNELD_KUBE_ANNOTATION_PREFIX".to_string()
            )]
        );
        assert_eq!(cli.healthz_address(), Some("0.0.0.0:8285".parse().unwrap()));
        let defaults = Cli::from_env(["calc-flannel"].map(Into::into), |_| None);
        assert!(defaults.set_node_network_unavailable);
        assert_eq!(defaults.healthz_address(), None);
        assert_eq!(
            defaults.net_config_path,
            PathBuf::from("/etc/kube-flannel/net-conf.json")
        );
    }

    #[test]
    fn the_node_is_named_or_found_through_its_pod() {
        let vars = |set: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                set.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            node_identity(vars(&[("NODE_NAME", "n1"), ("POD_NAME", "p")])),
            Ok(NodeIdentity::Name("n1".into()))
        );
        assert_eq!(
            node_identity(vars(&[
                ("POD_NAME", "p"),
                ("POD_NAMESPACE", "kube-flannel")
            ])),
            Ok(NodeIdentity::Pod {
                namespace: "kube-flannel".into(),
                name: "p".into()
            })
        );
        assert!(node_identity(vars(&[("POD_NAME", "p")])).is_err());
    }

    #[test]
    fn the_renew_margin_is_minutes_or_a_duration() {
        assert_eq!(parse_minutes("60"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_minutes("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_minutes("soon").is_err());
    }

    #[test]
    fn the_margin_must_be_shorter_than_the_ttl() {
        let cli = Cli::from_env(
            [
                "calc-flannel",
                "--subnet-lease-ttl",
                "10s",
                "--subnet-lease-renew-margin",
                "10s",
            ]
            .map(Into::into),
            |_| None,
        );
        assert!(cli.check().unwrap_err().contains("must be shorter"));
    }
}
