//! `--http-listen`: Prometheus metrics and health probes, read with curl.

mod support;

use std::collections::HashMap;
use std::path::Path;

use support::{Daemon, http_get};

/// A daemon with an HTTP listener on a free loopback port, and its address.
fn daemon_with_http() -> (Daemon, String) {
    let daemon = Daemon::memory(&["--http-listen", "127.0.0.1:0"]);
    daemon.wait_for_log("serving metrics and health over HTTP", 1);
    let log = daemon.log();
    let line = log
        .lines()
        .find(|l| l.contains("serving metrics and health over HTTP"))
        .unwrap();
    let address = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("address="))
        .expect("the address in the log line")
        .to_string();
    (daemon, address)
}

/// The samples of an exposition: `name{labels}` to value. Checks each
/// line is a comment or a sample.
fn samples(exposition: &str) -> HashMap<String, f64> {
    let mut samples = HashMap::new();
    for line in exposition.lines() {
        if line.starts_with("# ") {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not a sample: {line:?}"));
        assert!(series.starts_with("vxmgr_"), "{line:?}");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line:?}"));
        samples.insert(series.to_string(), value);
    }
    samples
}

#[test]
fn probes_follow_readiness_and_metrics_count_what_happened() {
    let (daemon, address) = daemon_with_http();
    for path in ["/livez", "/liveness"] {
        assert_eq!(http_get(&address, path).0, 200, "{path}");
    }
    for path in ["/readyz", "/readiness"] {
        assert_eq!(http_get(&address, path).0, 503, "{path} before InSync");
    }
    assert_eq!(http_get(&address, "/nothing").0, 404);

    let replay = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replays/two-nodes.jsonl");
    let output = daemon.replay(&[replay.to_str().unwrap()]);
    assert!(output.status.success(), "{}", support::stderr(&output));
    daemon.wait_for_log("calc stream ended", 1);

    for path in ["/readyz", "/readiness"] {
        assert_eq!(http_get(&address, path).0, 200, "{path} once in sync");
    }
    let (code, content_type, body) = http_get(&address, "/metrics");
    assert_eq!(code, 200);
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    let samples = samples(&body);
    let value = |series: &str| {
        *samples
            .get(series)
            .unwrap_or_else(|| panic!("{series} in\n{body}"))
    };
    assert_eq!(value("vxmgr_build_info{version=\"0.1.0\"}"), 1.0);
    assert!(value("vxmgr_batches_total{result=\"ok\"}") >= 1.0);
    let messages: f64 = samples
        .iter()
        .filter(|(s, _)| s.starts_with("vxmgr_messages_total{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(messages, 7.0, "the replay's seven messages");
    assert_eq!(
        value("vxmgr_messages_total{type=\"vtep_update\",outcome=\"applied\"}"),
        2.0
    );
    assert!(value("vxmgr_batch_apply_duration_seconds_count") >= 1.0);
    assert!(value("vxmgr_last_batch_timestamp_seconds") > 1.7e9);
    assert!(value("vxmgr_kernel_operations_total{kind=\"route\",op=\"add\",result=\"ok\"}") >= 3.0);
    for (kind, count) in [
        ("device", 1.0),
        ("route", 3.0),
        ("neighbor", 1.0),
        ("fdb", 1.0),
        ("ipset_member", 1.0),
    ] {
        let v4 = format!("vxmgr_programmed_objects{{kind=\"{kind}\",family=\"ipv4\"}}");
        let v6 = format!("vxmgr_programmed_objects{{kind=\"{kind}\",family=\"ipv6\"}}");
        assert_eq!((value(&v4), value(&v6)), (count, 0.0), "{kind}");
    }
    assert_eq!(value("vxmgr_failing_objects"), 0.0);
    assert_eq!(value("vxmgr_contested_objects"), 0.0);
    assert_eq!(
        value("vxmgr_resyncs_total{trigger=\"startup\",result=\"ok\"}"),
        1.0
    );
    assert_eq!(
        value("vxmgr_calc_stream_connected"),
        0.0,
        "the replay ended"
    );
    assert_eq!(value("vxmgr_calc_stream_in_sync"), 1.0);
    assert_eq!(value("vxmgr_ready"), 1.0);
}

#[test]
fn firewall_operations_are_counted_by_kind_and_operation() {
    let (daemon, address) = daemon_with_http();
    let two_nodes = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replays/two-nodes.jsonl");
    let mut lines: Vec<String> = std::fs::read_to_string(two_nodes)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let in_sync = lines.iter().position(|l| l.contains("inSync")).unwrap();
    lines.insert(
        in_sync,
        r#"{"ipamPoolUpdate": {"id": "pods", "pool": {"cidr": "10.244.0.0/16", "masquerade": true}}}"#
            .to_string(),
    );
    let dir = tempfile::tempdir().unwrap();
    let replay = dir.path().join("pools.jsonl");
    std::fs::write(&replay, lines.join("\n")).unwrap();
    let output = daemon.replay(&[replay.to_str().unwrap()]);
    assert!(output.status.success(), "{}", support::stderr(&output));
    daemon.wait_for_log("calc stream ended", 1);

    let (_, _, body) = http_get(&address, "/metrics");
    let samples = samples(&body);
    let value = |kind: &str, op: &str| {
        let series =
            format!("vxmgr_kernel_operations_total{{kind=\"{kind}\",op=\"{op}\",result=\"ok\"}}");
        samples.get(&series).copied().unwrap_or(0.0)
    };
    // One table with its sets and rule, one IPv4 forward chain.
    assert_eq!(value("nft_table", "create"), 1.0, "{body}");
    assert_eq!(value("iptables_chain", "write"), 1.0, "{body}");
    assert_eq!(value("iptables_chain", "remove"), 0.0, "{body}");
}
