//! calc-flannel against an etcd that wants a password, and one that wants
//! TLS with client certificates: the real binaries, a vxmgrd on its
//! memory kernel, no namespaces (no root needed). Needs the etcd and
//! etcdctl binaries (and openssl for the certificates); skips without them
//! unless VXMGR_REQUIRE_ETCD=1.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::Daemon;
use support::flannel::{Agent, block_on, etcd_available, tool_available};
use support::testbed::etcd::{EtcdServer, EtcdTls};

const CONFIG: &str = r#"{"Network": "10.50.0.0/16", "Backend": {"Type": "host-gw"}}"#;

fn write_config(etcd: &EtcdServer) {
    block_on(async {
        etcd.client()
            .await?
            .put("/coreos.com/network/config", CONFIG)
            .await
    })
    .unwrap();
}

/// Runs `command`, which must succeed; its output.
fn run(command: &mut Command) -> String {
    let output = command.output().expect("the command runs");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn etcdctl(etcd: &EtcdServer, args: &[&str]) -> String {
    run(Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", etcd.client_url()])
        .args(args))
}

#[test]
fn a_username_and_password_are_sent_and_a_wrong_one_is_reported() {
    let test = "a_username_and_password_are_sent_and_a_wrong_one_is_reported";
    if !etcd_available(test) || !tool_available(test, "etcdctl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(None, "127.0.0.1", dir.path()).unwrap();
    write_config(&etcd);
    etcdctl(&etcd, &["user", "add", "root:secret"]);
    etcdctl(&etcd, &["user", "grant-role", "root", "root"]);
    etcdctl(&etcd, &["auth", "enable"]);

    let daemon = Daemon::memory(&[]);
    let wrong = Agent::start(
        &daemon,
        "wrong-password",
        &[
            "--etcd-endpoints",
            etcd.client_url(),
            "--etcd-username",
            "root",
            "--etcd-password",
            "wrong",
        ],
    );
    wrong.wait_for_log("authentication failed");
    drop(wrong);

    let agent = Agent::start(
        &daemon,
        "password",
        &[
            "--etcd-endpoints",
            etcd.client_url(),
            "--etcd-username",
            "root",
            "--etcd-password",
            "secret",
        ],
    );
    agent.wait_for_log("vxmgrd in sync");
    let leases = etcdctl(
        &etcd,
        &[
            "--user",
            "root:secret",
            "get",
            "--prefix",
            "/coreos.com/network/subnets/",
            "--keys-only",
        ],
    );
    assert_eq!(
        leases.lines().filter(|l| !l.is_empty()).count(),
        1,
        "{leases}"
    );
}

/// A CA, and certificates it signs for etcd (127.0.0.1) and for a client.
fn certificates(dir: &Path) -> (EtcdTls, EtcdTls) {
    let openssl = |args: &[&str]| run(Command::new("openssl").current_dir(dir).args(args));
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec![
        "req",
        "-x509",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ];
    ca.extend(ec);
    openssl(&ca);
    for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let mut request = vec!["req", "-subj", "/CN=test", "-keyout", &key, "-out", &csr];
        request.extend(ec);
        openssl(&request);
        let ext = format!("{name}.ext");
        std::fs::write(
            dir.join(&ext),
            format!("subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n"),
        )
        .unwrap();
        let pem = format!("{name}.pem");
        openssl(&[
            "x509",
            "-req",
            "-days",
            "1",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ]);
    }
    let files = |name: &str| EtcdTls {
        ca: dir.join("ca.pem"),
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
    };
    (files("server"), files("client"))
}

#[test]
fn tls_with_client_certificates() {
    let test = "tls_with_client_certificates";
    if !etcd_available(test) || !tool_available(test, "openssl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = certificates(dir.path());
    let etcd =
        EtcdServer::start_with(None, "127.0.0.1", &dir.path().join("etcd"), Some(server)).unwrap();
    assert!(etcd.client_url().starts_with("https://"));
    write_config(&etcd);

    let daemon = Daemon::memory(&[]);
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let (ca, cert, key) = (path(&client.ca), path(&client.cert), path(&client.key));
    let trusting_etcd = ["--etcd-endpoints", etcd.client_url(), "--etcd-cafile", &ca];
    let certificate = ["--etcd-certfile", &cert, "--etcd-keyfile", &key];
    let agent = Agent::start(&daemon, "tls", &[&trusting_etcd[..], &certificate].concat());
    agent.wait_for_log("vxmgrd in sync");
    let leases = block_on(async {
        etcd.client()
            .await?
            .list("/coreos.com/network/subnets/")
            .await
    })
    .unwrap();
    assert_eq!(leases.len(), 1, "{leases:?}");

    // The same client without its certificate: etcd refuses it in the
    // TLS handshake for want of one, and the agent says it cannot reach
    // etcd.
    let refused = Agent::start(&daemon, "no-client-certificate", &trusting_etcd);
    refused.wait_for_log("etcd unreachable");
    let why = "tls: client didn't provide a certificate";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(etcd.log_path()).expect("etcd's log");
        if log.contains(why) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "etcd never logged {why:?}:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_endpoint_that_does_not_answer_is_left_for_the_next() {
    let test = "an_endpoint_that_does_not_answer_is_left_for_the_next";
    if !etcd_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(None, "127.0.0.1", dir.path()).unwrap();
    write_config(&etcd);
    // Nothing listens there.
    let dead = format!(
        "http://127.0.0.1:{}",
        support::testbed::free_port().unwrap()
    );
    let daemon = Daemon::memory(&[]);
    let endpoints = format!("{dead},{}", etcd.client_url());
    let agent = Agent::start(&daemon, "failover", &["--etcd-endpoints", &endpoints]);
    agent.wait_for_log("vxmgrd in sync");
    let log = agent.log();
    let moved = log
        .lines()
        .find(|l| l.contains("etcd endpoint not answering: moving to the next"))
        .unwrap_or_else(|| panic!("no move to the next endpoint in:\n{log}"));
    assert!(
        moved.contains(&format!("endpoint={dead}"))
            && moved.contains(&format!("next={}", etcd.client_url())),
        "{moved}"
    );
    // Staying there: no call goes to the dead endpoint again.
    assert_eq!(log.matches("moving to the next").count(), 1, "{log}");
}

/// More leases than the listing reads in one page (10,000 keys): every one
/// reaches vxmgrd, the first and the last included.
#[test]
fn a_listing_longer_than_one_page_is_taken_whole() {
    let test = "a_listing_longer_than_one_page_is_taken_whole";
    if !etcd_available(test) {
        return;
    }
    const LEASES: u32 = 10_050;
    let dst = |i: u32| format!("10.{}.{}.0/24", 1 + i / 256, i % 256);
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(None, "127.0.0.1", dir.path()).unwrap();
    let pairs: Vec<(String, String)> = (0..LEASES)
        .map(|i| {
            let key = format!("/coreos.com/network/subnets/{}", dst(i).replace('/', "-"));
            let public = format!("172.16.{}.{}", i / 250, i % 250 + 1);
            let value =
                format!(r#"{{"PublicIP":"{public}","PublicIPv6":null,"BackendType":"host-gw"}}"#);
            (key, value)
        })
        .collect();
    block_on(async {
        let mut client = etcd.client().await?;
        client
            .put(
                "/coreos.com/network/config",
                r#"{"Network": "10.0.0.0/8", "Backend": {"Type": "host-gw"}}"#,
            )
            .await?;
        // etcd takes at most 128 operations in a transaction.
        for chunk in pairs.chunks(100) {
            client.put_all(chunk).await?;
        }
        Ok::<(), support::testbed::TestbedError>(())
    })
    .unwrap();

    let daemon = Daemon::memory(&[]);
    let agent = Agent::start(&daemon, "pages", &["--etcd-endpoints", etcd.client_url()]);
    agent.wait_for_log("vxmgrd in sync");
    let state = block_on(daemon.state());
    let v4 = state.ipv4.unwrap_or_default();
    // Leases of nodes off this node's networks wait for their address.
    let routed: BTreeSet<String> = v4
        .direct_routes
        .iter()
        .map(|r| r.dst.clone())
        .chain(v4.waiting_routes.iter().map(|r| r.dst.clone()))
        .collect();
    let expected: BTreeSet<String> = (0..LEASES).map(dst).collect();
    let missing: Vec<&String> = expected.difference(&routed).take(5).collect();
    assert!(
        missing.is_empty(),
        "{} of {LEASES} leases did not reach vxmgrd, e.g. {missing:?}",
        expected.difference(&routed).count()
    );
}
