//! flannel's `subnet.env`, which CNI plugins read: the network, this node's
//! subnet (its first address with the length, as flannel writes it), the
//! MTU and whether flannel masquerades; its format is the library's
//! `SubnetEnv`, which the CNI plugin parses. Written atomically; read
//! back on start for the subnets it names.

use std::io::Write;
use std::path::Path;

use ipnetwork::IpNetwork;
use vxmgr::subnet_env::{SubnetEnv, SubnetEnvError, Subnets};

use crate::network::NetworkConfig;
use crate::subnet::{SubnetKey, nth_address};

/// The file's text. FLANNEL_IPMASQ says whether vxmgrd masquerades the
/// pods' traffic (--ip-masq); when it is false, the CNI plugin masquerades
/// itself if asked to.
pub fn render(config: &NetworkConfig, key: &SubnetKey, mtu: u32, ip_masq: bool) -> String {
    let first = |net: IpNetwork| {
        IpNetwork::new(nth_address(&net, 1), net.prefix()).expect("the same prefix")
    };
    let v6 = config.v6.as_ref().zip(key.v6);
    SubnetEnv {
        networks: vec![config.v4.network],
        subnet: Some(first(IpNetwork::V4(key.v4))),
        ipv6_networks: v6.iter().map(|(range, _)| range.network).collect(),
        ipv6_subnet: v6.map(|(_, subnet)| first(IpNetwork::V6(subnet))),
        mtu,
        ip_masq,
    }
    .to_string()
}

/// Replaces `path` with `text` in one step: a reader sees the old file or
/// the new one, never half of one.
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut file = tempfile::Builder::new()
        .prefix(".subnet.env")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .tempfile_in(dir)?;
    file.write_all(text.as_bytes())?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading {}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Bad {
        path: std::path::PathBuf,
        source: SubnetEnvError,
    },
}

/// The subnets the file at `path` names; none when there is no file (the
/// node's first start).
pub fn read_subnets(path: &Path) -> Result<Subnets, ReadError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Subnets::default()),
        Err(source) => {
            return Err(ReadError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    text.parse().map_err(|source| ReadError::Bad {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flannels_format() {
        let config = NetworkConfig::parse(
            r#"{"Network": "10.244.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00:244::/48", "Backend": {"Type": "vxlan"}}"#,
        )
        .unwrap();
        let key: SubnetKey = "10.244.58.0-24&fd00:244:0:3::-64".parse().unwrap();
        assert_eq!(
            render(&config, &key, 1450, false),
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.58.1/24\n\
             FLANNEL_IPV6_NETWORK=fd00:244::/48\nFLANNEL_IPV6_SUBNET=fd00:244:0:3::1/64\n\
             FLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n"
        );
        assert!(render(&config, &key, 1450, true).ends_with("FLANNEL_IPMASQ=true\n"));
    }

    #[test]
    fn the_subnets_are_read_back_and_a_missing_file_names_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("subnet.env");
        assert_eq!(read_subnets(&path).unwrap(), Subnets::default());
        let config =
            NetworkConfig::parse(r#"{"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}"#)
                .unwrap();
        let key: SubnetKey = "10.244.87.0-24".parse().unwrap();
        write(&path, &render(&config, &key, 1450, false)).unwrap();
        let subnets = read_subnets(&path).unwrap();
        assert_eq!(subnets.v4.unwrap().to_string(), "10.244.87.1/24");
        write(&path, "FLANNEL_SUBNET=banana\n").unwrap();
        let error = read_subnets(&path).unwrap_err().to_string();
        assert!(error.contains("subnet.env: line 1"), "{error}");
    }

    #[test]
    fn written_whole_with_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/flannel/subnet.env");
        write(&path, "FLANNEL_MTU=1\n").unwrap();
        write(&path, "FLANNEL_MTU=2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "FLANNEL_MTU=2\n");
        let entries = std::fs::read_dir(path.parent().unwrap()).unwrap().count();
        assert_eq!(entries, 1, "no temporary file left");
    }
}
