use super::*;
use crate::registry::kube::memory::{flannel_node, test_node};

const CONFIG: &str = r#"{"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}"#;
const DUAL: &str = r#"{"Network": "10.244.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00:244::/48", "Backend": {"Type": "vxlan"}}"#;

fn config(text: &str) -> NetworkConfig {
    NetworkConfig::parse(text).unwrap()
}

fn names() -> AnnotationNames {
    AnnotationNames::new("flannel.alpha.coreos.com")
}

fn with(mut node: Node, name: &str, value: Option<&str>) -> Node {
    let annotations = node.metadata.annotations.get_or_insert_default();
    let name = format!("flannel.alpha.coreos.com/{name}");
    match value {
        Some(v) => annotations.insert(name, v.into()),
        None => annotations.remove(&name),
    };
    node
}

#[test]
fn an_annotated_node_is_a_lease() {
    let node = flannel_node("n2", "10.244.2.0/24", "192.168.10.2", "0e:00:00:00:00:02");
    let NodeLease::Lease(lease) = node_lease(&node, &names(), &config(CONFIG)) else {
        panic!("not a lease");
    };
    assert_eq!(lease.key.to_string(), "10.244.2.0-24");
    assert_eq!(
        lease.attrs.to_json(),
        r#"{"PublicIP":"192.168.10.2","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:02"}}"#
    );
}

#[test]
fn a_dual_stack_node_has_both_subnets_and_a_v4_only_one_is_used_over_v4() {
    let node = test_node("n3", &["10.244.3.0/24", "fd00:244:0:3::/64"], &[]);
    assert_eq!(
        pod_cidrs(&node, &config(DUAL)),
        PodCidrs::Key("10.244.3.0-24&fd00:244:0:3::-64".parse().unwrap())
    );
    // Without IPv6 in the network, the IPv6 podCIDR is not looked at.
    assert_eq!(
        pod_cidrs(&node, &config(CONFIG)),
        PodCidrs::Key("10.244.3.0-24".parse().unwrap())
    );
    let v4_only = test_node("n4", &["10.244.4.0/24"], &[]);
    assert_eq!(
        pod_cidrs(&v4_only, &config(DUAL)),
        PodCidrs::Key("10.244.4.0-24".parse().unwrap())
    );
}

#[test]
fn pod_cidrs_outside_the_network_are_refused_by_name() {
    for (cidr, why) in [
        (
            "10.99.0.0/24",
            "podCIDR 10.99.0.0/24 is outside the network 10.244.0.0/16",
        ),
        (
            "10.0.0.0/8",
            "podCIDR 10.0.0.0/8 is outside the network 10.244.0.0/16",
        ),
        ("10.244.3.7/24", "not a subnet's first address"),
        ("garbage", "\"garbage\" is not a CIDR"),
    ] {
        let node = test_node("n", &[cidr], &[]);
        match pod_cidrs(&node, &config(CONFIG)) {
            PodCidrs::Refused(problem) => assert!(problem.contains(why), "{problem}"),
            other => panic!("{cidr}: {other:?}"),
        }
    }
    assert_eq!(
        pod_cidrs(&test_node("n", &[], &[]), &config(CONFIG)),
        PodCidrs::Missing("no IPv4 spec.podCIDR")
    );
}

#[test]
fn bad_annotations_are_unreadable_with_the_reason() {
    let good = flannel_node("n2", "10.244.2.0/24", "192.168.10.2", "0e:00:00:00:00:02");
    for (annotation, value, why) in [
        (
            "public-ip",
            Some("300.1.1.1"),
            "public-ip is not an IPv4 address",
        ),
        (
            "public-ip",
            None,
            "no flannel.alpha.coreos.com/public-ip annotation",
        ),
        (
            "backend-data",
            Some("{not json"),
            "backend-data is not JSON",
        ),
        (
            "backend-type",
            None,
            "no flannel.alpha.coreos.com/backend-type annotation",
        ),
        ("public-ipv6", Some("10.0.0.1"), "is not an IPv6 address"),
    ] {
        let node = with(good.clone(), annotation, value);
        match node_lease(&node, &names(), &config(CONFIG)) {
            NodeLease::Unreadable(key, problem) => {
                assert_eq!(key.to_string(), "10.244.2.0-24");
                assert!(problem.contains(why), "{annotation}: {problem}");
            }
            other => panic!("{annotation}: {other:?}"),
        }
    }
}

#[test]
fn only_nodes_of_the_kube_subnet_manager_with_a_pod_cidr_count() {
    let good = flannel_node("n2", "10.244.2.0/24", "192.168.10.2", "0e:00:00:00:00:02");
    let not_managed = with(good.clone(), "kube-subnet-manager", Some("false"));
    assert!(matches!(
        node_lease(&not_managed, &names(), &config(CONFIG)),
        NodeLease::None(_)
    ));
    let mut no_cidr = good.clone();
    no_cidr.spec = None;
    assert!(matches!(
        node_lease(&no_cidr, &names(), &config(CONFIG)),
        NodeLease::None(_)
    ));
    let outside = flannel_node("n9", "10.99.0.0/24", "192.168.10.9", "0e:00:00:00:00:09");
    assert!(matches!(
        node_lease(&outside, &names(), &config(CONFIG)),
        NodeLease::Refused(why) if why.contains("outside the network")
    ));
}

#[test]
fn own_annotations_are_flannels_and_patched_only_where_they_differ() {
    let attrs = LeaseAttrs::vxlan(
        "192.168.10.1".parse().unwrap(),
        crate::lease::VxlanData {
            vni: 1,
            vtep_mac: "0e:00:00:00:00:01".parse().unwrap(),
        },
        None,
    );
    let wanted = wanted_annotations(&names(), &attrs);
    assert_eq!(
        wanted,
        BTreeMap::from(
            [
                ("backend-data", r#"{"VNI":1,"VtepMAC":"0e:00:00:00:00:01"}"#),
                ("backend-type", "vxlan"),
                ("kube-subnet-manager", "true"),
                ("public-ip", "192.168.10.1"),
            ]
            .map(|(k, v)| (format!("flannel.alpha.coreos.com/{k}"), v.to_string()))
        )
    );
    let bare = test_node("n1", &["10.244.1.0/24"], &[("other", "x")]);
    assert_eq!(annotations_to_patch(&bare, &wanted), wanted);
    let done = flannel_node("n1", "10.244.1.0/24", "192.168.10.1", "0e:00:00:00:00:01");
    assert!(annotations_to_patch(&done, &wanted).is_empty());
    let moved = with(done, "public-ip", Some("192.168.10.7"));
    assert_eq!(
        annotations_to_patch(&moved, &wanted),
        BTreeMap::from([(
            "flannel.alpha.coreos.com/public-ip".to_string(),
            "192.168.10.1".to_string()
        )])
    );

    let host_gw = wanted_annotations(
        &names(),
        &LeaseAttrs::host_gw(
            "192.168.10.1".parse().unwrap(),
            Some("fd00:10::1".parse().unwrap()),
        ),
    );
    assert_eq!(host_gw["flannel.alpha.coreos.com/backend-data"], "null");
    assert_eq!(host_gw["flannel.alpha.coreos.com/backend-v6-data"], "null");
    assert_eq!(
        host_gw["flannel.alpha.coreos.com/public-ipv6"],
        "fd00:10::1"
    );
}

#[test]
fn overwrites_replace_the_public_addresses_and_bad_ones_are_named() {
    let attrs = LeaseAttrs::host_gw(
        "192.168.10.1".parse().unwrap(),
        Some("fd00:10::1".parse().unwrap()),
    );
    let node = test_node(
        "n1",
        &["10.244.1.0/24"],
        &[
            (
                "flannel.alpha.coreos.com/public-ip-overwrite",
                "203.0.113.1",
            ),
            (
                "flannel.alpha.coreos.com/public-ipv6-overwrite",
                "2001:db8::1",
            ),
        ],
    );
    let (over, problems) = overwritten(&node, &names(), attrs.clone());
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(over.public_ip.to_string(), "203.0.113.1");
    assert_eq!(over.public_ipv6.unwrap().to_string(), "2001:db8::1");

    let bad = with(node, "public-ip-overwrite", Some("nope"));
    let (kept, problems) = overwritten(&bad, &names(), attrs.clone());
    assert_eq!(kept.public_ip, attrs.public_ip);
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].contains("public-ip-overwrite \"nope\""),
        "{problems:?}"
    );
}

#[test]
fn the_status_patch_is_flanneds_condition() {
    let patch = network_available_patch("2024-01-01T00:00:00Z");
    let condition = &patch["status"]["conditions"][0];
    assert_eq!(condition["type"], "NetworkUnavailable");
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "FlannelIsUp");
    assert_eq!(condition["message"], "Flannel is running on this node");
}
