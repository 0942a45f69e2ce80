//! A real etcd cluster for fault tests: one member per address, each in a
//! network namespace of its own plugged into the cluster's underlay bridge,
//! so that a member can be killed, restarted or cut off (nftables dropping
//! everything but its loopback) while the others go on. Its state is read
//! with `etcdctl` from inside each member's namespace and the members'
//! metrics over their unix sockets (a cut-off member still answers both).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

use super::etcd::{EtcdClient, EtcdServer};
use super::{Cluster, Result, TestbedError, run, run_in, sh};

/// The nftables table that cuts a member off.
const PARTITION_TABLE: &str = "vxmgr_partition";
/// How long a cluster may take to elect a leader after a fault.
const ELECTION_WAIT: Duration = Duration::from_secs(30);

pub struct EtcdCluster {
    /// Dropped first: the members stop before their namespaces go.
    pub members: Vec<EtcdServer>,
    namespaces: Vec<String>,
    keep: bool,
}

/// What one member says of itself and of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    pub member_id: u64,
    pub leader: u64,
    pub revision: i64,
}

impl EtcdCluster {
    /// One member per address (`m1`, `m2`, ...), in namespaces
    /// `<cluster prefix>m<i>` on `cluster`'s underlay, data under the
    /// cluster's directory; returns once every member serves.
    pub fn start(cluster: &Cluster, addresses: &[&str]) -> Result<EtcdCluster> {
        let mut etcd = EtcdCluster {
            members: Vec::new(),
            namespaces: Vec::new(),
            keep: false,
        };
        let initial_cluster: Vec<String> = (1..)
            .zip(addresses)
            .map(|(i, address)| format!("m{i}=http://{address}:2380"))
            .collect();
        let initial_cluster = initial_cluster.join(",");
        for (i, address) in (1..).zip(addresses) {
            let ns = format!("{}m{i}", cluster.prefix);
            run(&["ip", "netns", "add", &ns])?;
            etcd.namespaces.push(ns.clone());
            sh(&ns, "ip link set lo up")?;
            cluster.add_underlay_link(&ns, "eth0", &format!("{}m{i}", cluster.prefix))?;
            sh(&ns, &format!("ip addr add {address}/24 dev eth0"))?;
            let dir = cluster.dir.join(format!("etcd-m{i}"));
            etcd.members.push(EtcdServer::spawn_member(
                &ns,
                address,
                &dir,
                &format!("m{i}"),
                &initial_cluster,
            )?);
        }
        for member in &mut etcd.members {
            member.wait_serving()?;
        }
        Ok(etcd)
    }

    /// Every member's client URL, comma-separated, as `--etcd-endpoints`
    /// takes them.
    pub fn endpoints(&self) -> String {
        let urls: Vec<&str> = self.members.iter().map(|m| m.client_url()).collect();
        urls.join(",")
    }

    /// Member `i`'s (from 0) namespace.
    pub fn ns(&self, i: usize) -> &str {
        &self.namespaces[i]
    }

    pub fn member(&mut self, i: usize) -> &mut EtcdServer {
        &mut self.members[i]
    }

    /// A client of member `i` over its unix socket (reachable when the
    /// member is cut off).
    pub async fn client(&self, i: usize) -> Result<EtcdClient> {
        self.members[i].client().await
    }

    /// `etcdctl <args>` against member `i`, from its own namespace.
    pub fn etcdctl(&self, i: usize, args: &[&str]) -> Result<String> {
        let mut full = vec!["etcdctl", "--endpoints", self.members[i].client_url()];
        full.extend_from_slice(args);
        run_in(&self.namespaces[i], &full)
    }

    /// What member `i` says of itself.
    pub fn status(&self, i: usize) -> Result<MemberStatus> {
        let text = self.etcdctl(i, &["endpoint", "status", "-w", "json"])?;
        let unreadable = |reason: String| TestbedError::Output {
            command: "etcdctl endpoint status".into(),
            reason,
        };
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| unreadable(format!("{e}: {text}")))?;
        let status = &json[0]["Status"];
        let number = |v: &serde_json::Value| {
            v.as_u64()
                .ok_or_else(|| unreadable(format!("no number in {text}")))
        };
        Ok(MemberStatus {
            member_id: number(&status["header"]["member_id"])?,
            leader: number(&status["leader"])?,
            revision: number(&status["header"]["revision"])? as i64,
        })
    }

    /// The index of the member that leads (as member `asked` says), once
    /// it knows one: just after a fault the cluster may still be electing.
    pub fn leader(&self, asked: usize) -> Result<usize> {
        let deadline = Instant::now() + ELECTION_WAIT;
        loop {
            match self.known_leader(asked) {
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                result => return result,
            }
        }
    }

    fn known_leader(&self, asked: usize) -> Result<usize> {
        let leader = self.status(asked)?.leader;
        for i in 0..self.members.len() {
            if self.status(i)?.member_id == leader {
                return Ok(i);
            }
        }
        Err(TestbedError::Output {
            command: "etcdctl endpoint status".into(),
            reason: format!("no member has the leader's id {leader}"),
        })
    }

    /// Watchers open on member `i` (its `etcd_debugging_mvcc_watcher_total`,
    /// read over its unix socket).
    pub fn watchers(&self, i: usize) -> Result<u64> {
        let socket = self.members[i].socket_path();
        let unreadable = |reason: String| TestbedError::Output {
            command: format!("GET /metrics on {}", socket.display()),
            reason,
        };
        let mut stream = UnixStream::connect(&socket)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")?;
        let mut text = String::new();
        stream.read_to_string(&mut text)?;
        text.lines()
            .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
            .ok_or_else(|| unreadable("no etcd_debugging_mvcc_watcher_total".into()))
    }

    /// Cuts member `i` off: everything but its loopback traffic dropped.
    pub fn partition(&self, i: usize) -> Result<()> {
        cut_off(
            &self.namespaces[i],
            "iifname != \"lo\" drop",
            "oifname != \"lo\" drop",
        )
    }

    /// Ends member `i`'s partition.
    pub fn heal(&self, i: usize) -> Result<()> {
        heal(&self.namespaces[i])
    }

    /// Compacts the cluster's history up to `revision` (asking member `i`).
    pub fn compact(&self, i: usize, revision: i64) -> Result<()> {
        self.etcdctl(i, &["compact", &revision.to_string(), "--physical"])?;
        Ok(())
    }

    /// Leaves the members and their namespaces when dropped.
    pub fn keep(&mut self) {
        self.keep = true;
        for member in &mut self.members {
            member.keep();
        }
    }
}

/// Drops what `input` and `output` (nftables rules) match in namespace
/// `ns`, until [`heal`]: a partition.
pub fn cut_off(ns: &str, input: &str, output: &str) -> Result<()> {
    let script = format!(
        "table inet {PARTITION_TABLE} {{\n\
         chain input {{ type filter hook input priority -300; {input}; }}\n\
         chain output {{ type filter hook output priority -300; {output}; }}\n\
         }}\n"
    );
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .map_err(|source| TestbedError::Spawn {
            command: format!("nft -f - in {ns}"),
            source,
        })?;
    std::io::Write::write_all(
        &mut child.stdin.take().expect("stdin is piped"),
        script.as_bytes(),
    )?;
    let status = child.wait()?;
    if !status.success() {
        return Err(TestbedError::Output {
            command: format!("nft -f - in {ns}"),
            reason: format!("{status} for {script}"),
        });
    }
    Ok(())
}

/// Ends the partition [`cut_off`] made in `ns`.
pub fn heal(ns: &str) -> Result<()> {
    sh(ns, &format!("nft delete table inet {PARTITION_TABLE}"))?;
    Ok(())
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        // Each member is killed by its own drop.
        self.members.clear();
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}
