//! Dataplane settings: Felix's defaults, overridden by the calc process's
//! ConfigUpdate, overridden by explicit command-line flags.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ipnetwork::IpNetwork;

use crate::model::Family;
use crate::model::update::{Rejection, parse_cidr, quote};

/// The settings in effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub vni: u32,
    pub port: u16,
    /// `None`: the parent interface's MTU minus the encapsulation overhead.
    pub mtu_v4: Option<u32>,
    pub mtu_v6: Option<u32>,
    pub route_protocol: u8,
    pub external_nodes: Vec<IpNetwork>,
    /// `None`: no periodic resync.
    pub route_refresh_interval: Option<Duration>,
    pub device_names: DeviceNames,
}

/// The VXLAN device of each family, by name: vxmgr owns the devices of
/// the names in effect (and what is on them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceNames(Arc<[Arc<str>; 2]>);

impl DeviceNames {
    fn new(v4: Arc<str>, v6: Arc<str>) -> DeviceNames {
        DeviceNames(Arc::new([v4, v6]))
    }

    pub fn of(&self, family: Family) -> &Arc<str> {
        &self.0[family as usize]
    }
}

/// Felix's names.
impl Default for DeviceNames {
    fn default() -> Self {
        DeviceNames::new(
            Arc::from(Family::V4.device_name()),
            Arc::from(Family::V6.device_name()),
        )
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            vni: 4096,
            port: 4789,
            mtu_v4: None,
            mtu_v6: None,
            route_protocol: FELIX_ROUTE_PROTOCOL,
            external_nodes: Vec::new(),
            route_refresh_interval: Some(Duration::from_secs(90)),
            device_names: DeviceNames::default(),
        }
    }
}

/// Values one source sets; unset fields fall through to the next source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SettingsLayer {
    pub vni: Option<u32>,
    pub port: Option<u16>,
    pub mtu_v4: Option<Option<u32>>,
    pub mtu_v6: Option<Option<u32>>,
    pub route_protocol: Option<u8>,
    pub external_nodes: Option<Vec<IpNetwork>>,
    pub route_refresh_interval: Option<Option<Duration>>,
    pub device_v4: Option<Arc<str>>,
    pub device_v6: Option<Arc<str>>,
}

impl SettingsLayer {
    fn over(&self, base: Settings) -> Settings {
        Settings {
            vni: self.vni.unwrap_or(base.vni),
            port: self.port.unwrap_or(base.port),
            mtu_v4: self.mtu_v4.unwrap_or(base.mtu_v4),
            mtu_v6: self.mtu_v6.unwrap_or(base.mtu_v6),
            route_protocol: self.route_protocol.unwrap_or(base.route_protocol),
            external_nodes: self.external_nodes.clone().unwrap_or(base.external_nodes),
            route_refresh_interval: self
                .route_refresh_interval
                .unwrap_or(base.route_refresh_interval),
            device_names: DeviceNames::new(
                self.device_v4
                    .clone()
                    .unwrap_or_else(|| base.device_names.of(Family::V4).clone()),
                self.device_v6
                    .clone()
                    .unwrap_or_else(|| base.device_names.of(Family::V6).clone()),
            ),
        }
    }
}

/// The three sources of settings.
#[derive(Clone, Debug, Default)]
pub struct Config {
    from_calc: SettingsLayer,
    from_flags: SettingsLayer,
}

impl Config {
    pub fn new(from_flags: SettingsLayer) -> Config {
        Config {
            from_calc: SettingsLayer::default(),
            from_flags,
        }
    }

    pub fn settings(&self) -> Settings {
        self.from_flags
            .over(self.from_calc.over(Settings::default()))
    }

    /// Takes a ConfigUpdate's map as the calc process's complete config: keys
    /// it no longer sets return to their defaults. A key with a bad value keeps
    /// its previous value and is reported; the other keys still apply.
    pub fn apply_update(&mut self, config: &BTreeMap<String, String>) -> Result<(), Rejection> {
        let mut next = SettingsLayer::default();
        let mut errors = Vec::new();
        let previous = &self.from_calc;
        let field = |key: &'static str| config.get(key).map(|v| (key, v.trim()));
        if let Some((k, v)) = field("VXLANVNI") {
            next.vni = parse(k, v, parse_vni).or_keep(previous.vni, &mut errors);
        }
        if let Some((k, v)) = field("VXLANPort") {
            next.port = parse(k, v, parse_port).or_keep(previous.port, &mut errors);
        }
        if let Some((k, v)) = field("VXLANMTU") {
            next.mtu_v4 = parse(k, v, parse_mtu_v4).or_keep(previous.mtu_v4, &mut errors);
        }
        if let Some((k, v)) = field("VXLANMTUV6") {
            next.mtu_v6 = parse(k, v, parse_mtu_v6).or_keep(previous.mtu_v6, &mut errors);
        }
        if let Some((k, v)) = field("DeviceRouteProtocol") {
            next.route_protocol =
                parse(k, v, parse_calc_protocol).or_keep(previous.route_protocol, &mut errors);
        }
        if let Some((k, v)) = field("ExternalNodesCIDRList") {
            next.external_nodes =
                parse(k, v, parse_cidr_list).or_keep(previous.external_nodes.clone(), &mut errors);
        }
        if let Some((k, v)) = field("RouteRefreshInterval") {
            next.route_refresh_interval = parse(k, v, parse_refresh_seconds)
                .or_keep(previous.route_refresh_interval, &mut errors);
        }
        if let Some((k, v)) = field("VXLANDeviceName") {
            next.device_v4 = parse(k, v, |v| parse_device_name(Family::V4, v))
                .or_keep(previous.device_v4.clone(), &mut errors);
        }
        if let Some((k, v)) = field("VXLANDeviceNameV6") {
            next.device_v6 = parse(k, v, |v| parse_device_name(Family::V6, v))
                .or_keep(previous.device_v6.clone(), &mut errors);
        }
        self.from_calc = next;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Rejection(errors.join("; ")))
        }
    }
}

/// A parsed config value, or why the key's previous value is kept.
struct Parsed<T>(Result<T, String>);

impl<T> Parsed<T> {
    fn or_keep(self, previous: Option<T>, errors: &mut Vec<String>) -> Option<T> {
        match self.0 {
            Ok(v) => Some(v),
            Err(e) => {
                errors.push(e);
                previous
            }
        }
    }
}

fn parse<T>(key: &str, value: &str, f: impl FnOnce(&str) -> Result<T, String>) -> Parsed<T> {
    Parsed(f(value).map_err(|why| format!("config {key} {}: {why}", quote(value))))
}

/// Felix's value syntax: `none`, in any case, sets a key to its zero value,
/// given here as the text the key's parser reads as zero.
fn none_is<'a>(zero: &'static str, v: &'a str) -> &'a str {
    if v.eq_ignore_ascii_case("none") {
        zero
    } else {
        v
    }
}

/// 0 is a VNI like any other to the kernel, and Felix's zero value.
pub fn parse_vni(v: &str) -> Result<u32, String> {
    match none_is("0", v).parse::<u32>() {
        Ok(n @ 0..=0xff_ffff) => Ok(n),
        _ => Err("VNI must be an integer from 0 to 16777215".into()),
    }
}

/// The port the kernel gives a VXLAN device created without one.
pub const KERNEL_DEFAULT_VXLAN_PORT: u16 = 8472;

/// 0 means the kernel's default port. It is set explicitly, so that the
/// device check compares the port the kernel reports with the one it set.
pub fn parse_port(v: &str) -> Result<u16, String> {
    match none_is("0", v).parse::<u16>() {
        Ok(0) => Ok(KERNEL_DEFAULT_VXLAN_PORT),
        Ok(n) => Ok(n),
        _ => Err("port must be an integer from 0 (the kernel's default) to 65535".into()),
    }
}

/// 0 means "derive from the parent interface".
pub fn parse_mtu_v4(v: &str) -> Result<Option<u32>, String> {
    parse_mtu(v, 68)
}

/// 0 means "derive from the parent interface"; IPv6 needs at least 1280.
pub fn parse_mtu_v6(v: &str) -> Result<Option<u32>, String> {
    parse_mtu(v, 1280)
}

fn parse_mtu(v: &str, min: u32) -> Result<Option<u32>, String> {
    match none_is("0", v).parse::<u32>() {
        Ok(0) => Ok(None),
        Ok(n) if (min..=65535).contains(&n) => Ok(Some(n)),
        _ => Err(format!(
            "MTU must be 0 (automatic) or an integer from {min} to 65535"
        )),
    }
}

/// Felix's own route protocol, which it uses in place of RTPROT_BOOT.
pub const FELIX_ROUTE_PROTOCOL: u8 = 80;

/// RTPROT_BOOT: what `ip route add` gives a route when no protocol is named.
const RTPROT_BOOT: u8 = 3;

/// Protocols the kernel and administrators use (unspec, redirect, kernel,
/// boot, static): routes of these are never vxmgr's, whatever it is told.
pub const RESERVED_ROUTE_PROTOCOLS: std::ops::RangeInclusive<u8> = 0..=4;

/// A route protocol from the command line or the environment: one that
/// cannot be the host's own.
pub fn parse_protocol(v: &str) -> Result<u8, String> {
    match v.parse::<u8>() {
        Ok(n) if RESERVED_ROUTE_PROTOCOLS.contains(&n) => Err(format!(
            "route protocol {n} is reserved for the kernel and administrators (0-4: unspec, \
             redirect, kernel, boot, static): vxmgr would take the host's own routes as its own; \
             use 5-255 (the default, {FELIX_ROUTE_PROTOCOL}, is Felix's)"
        )),
        Ok(n) => Ok(n),
        Err(_) => Err("route protocol must be an integer from 5 to 255".into()),
    }
}

/// A ConfigUpdate's DeviceRouteProtocol, as Felix reads it: Felix sends 3
/// (RTPROT_BOOT, its config default) and means its own protocol 80.
pub fn parse_calc_protocol(v: &str) -> Result<u8, String> {
    match v.parse::<u8>() {
        Ok(RTPROT_BOOT) => Ok(FELIX_ROUTE_PROTOCOL),
        _ => parse_protocol(v),
    }
}

/// Felix's list syntax: comma-separated, spaces around items ignored.
pub fn parse_cidr_list(v: &str) -> Result<Vec<IpNetwork>, String> {
    none_is("", v)
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| parse_cidr("CIDR", s).map_err(|e| e.0))
        .collect()
}

/// A VXLAN device name as Felix (`vxlan.calico`, `vxlan-v6.calico`) or
/// flannel (`flannel.<VNI>`, `flannel-v6.<VNI>`) names its devices. No
/// other name is taken: vxmgr deletes and recreates a device of its name
/// that is not the VXLAN device it wants, which must never be a host's
/// own interface.
pub fn parse_device_name(family: Family, v: &str) -> Result<Arc<str>, String> {
    let flannel = match family {
        Family::V4 => "flannel.",
        Family::V6 => "flannel-v6.",
    };
    let flannel_vni = v.strip_prefix(flannel).and_then(|n| {
        parse_vni(n)
            .ok()
            .filter(|vni| *vni != 0 && vni.to_string() == n)
    });
    if v == family.device_name() || flannel_vni.is_some() {
        Ok(Arc::from(v))
    } else {
        Err(format!(
            "{family} VXLAN device must be named {} or {flannel}<VNI>",
            family.device_name()
        ))
    }
}

/// Felix gives intervals in seconds, fractions allowed; 0 turns the
/// periodic refresh off.
pub fn parse_refresh_seconds(v: &str) -> Result<Option<Duration>, String> {
    match none_is("0", v).parse::<f64>() {
        Ok(0.0) => Ok(None),
        Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Some(Duration::from_secs_f64(s))),
        _ => Err("interval must be a number of seconds".into()),
    }
}

/// The command line's form: a duration ("90s", "2m") or, as Felix gives
/// it, a bare number of seconds; 0 turns the periodic refresh off.
pub fn parse_refresh_interval(v: &str) -> Result<Option<Duration>, String> {
    let v = none_is("0", v);
    if v.parse::<f64>().is_ok() {
        return parse_refresh_seconds(v);
    }
    match humantime::parse_duration(v) {
        Ok(d) if d.is_zero() => Ok(None),
        Ok(d) => Ok(Some(d)),
        Err(e) => Err(format!(
            "interval must be a duration (\"90s\", \"2m\") or a number of seconds: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_follow_felix() {
        let s = Config::default().settings();
        assert_eq!((s.vni, s.port, s.route_protocol), (4096, 4789, 80));
        assert_eq!((s.mtu_v4, s.mtu_v6), (None, None));
        assert_eq!(s.route_refresh_interval, Some(Duration::from_secs(90)));
    }

    #[test]
    fn calc_overrides_defaults_and_flags_override_both() {
        let mut c = Config::new(SettingsLayer {
            port: Some(8472),
            ..Default::default()
        });
        c.apply_update(&map(&[
            ("VXLANVNI", "1"),
            ("VXLANPort", "4790"),
            ("VXLANMTU", "1400"),
            ("ExternalNodesCIDRList", "10.1.0.0/16, 10.2.0.1"),
            ("RouteRefreshInterval", "0"),
            ("SomethingElse", "x"),
        ]))
        .unwrap();
        let s = c.settings();
        assert_eq!((s.vni, s.port, s.mtu_v4), (1, 8472, Some(1400)));
        assert_eq!(s.external_nodes.len(), 2);
        assert_eq!(s.external_nodes[1].to_string(), "10.2.0.1/32");
        assert_eq!(s.route_refresh_interval, None);
    }

    #[test]
    fn bad_values_are_named_and_keep_the_previous_value() {
        let mut c = Config::default();
        c.apply_update(&map(&[("VXLANVNI", "5000"), ("VXLANPort", "4790")]))
            .unwrap();
        let err = c
            .apply_update(&map(&[
                ("VXLANVNI", "16777216"),
                ("VXLANPort", "65536"),
                ("VXLANMTU", "1300"),
                ("VXLANMTUV6", "1000"),
                ("ExternalNodesCIDRList", "10.0.0.0/8,bogus"),
            ]))
            .unwrap_err();
        for part in [
            "VXLANVNI \"16777216\"",
            "VXLANPort \"65536\"",
            "VXLANMTUV6 \"1000\"",
            "ExternalNodesCIDRList \"10.0.0.0/8,bogus\"",
        ] {
            assert!(err.0.contains(part), "{part} missing from {err}");
        }
        let s = c.settings();
        assert_eq!((s.vni, s.port, s.mtu_v4), (5000, 4790, Some(1300)));
        assert!(s.external_nodes.is_empty());
    }

    #[test]
    fn refresh_interval_flag_takes_durations_and_bare_seconds() {
        let secs = |n| Ok(Some(Duration::from_secs(n)));
        assert_eq!(parse_refresh_interval("90s"), secs(90));
        assert_eq!(parse_refresh_interval("2m"), secs(120));
        assert_eq!(parse_refresh_interval("45"), secs(45));
        assert_eq!(
            parse_refresh_interval("1.5"),
            Ok(Some(Duration::from_millis(1500)))
        );
        assert_eq!(parse_refresh_interval("0"), Ok(None));
        assert_eq!(parse_refresh_interval("0s"), Ok(None));
        for bad in ["soon", "-5", "", "5 parsecs"] {
            assert!(parse_refresh_interval(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn refresh_interval_from_the_calc_stays_seconds() {
        let mut c = Config::default();
        c.apply_update(&map(&[("RouteRefreshInterval", "30")]))
            .unwrap();
        assert_eq!(
            c.settings().route_refresh_interval,
            Some(Duration::from_secs(30))
        );
        let err = c
            .apply_update(&map(&[("RouteRefreshInterval", "2m")]))
            .unwrap_err();
        assert!(err.0.contains("RouteRefreshInterval \"2m\""), "{err}");
    }

    #[test]
    fn device_names_are_felix_or_flannel_names() {
        let mut c = Config::default();
        assert_eq!(
            &**c.settings().device_names.of(Family::V6),
            "vxlan-v6.calico"
        );
        c.apply_update(&map(&[
            ("VXLANDeviceName", "flannel.1"),
            ("VXLANDeviceNameV6", "flannel-v6.1"),
        ]))
        .unwrap();
        let names = c.settings().device_names;
        assert_eq!(
            (
                &*names.of(Family::V4).clone(),
                &*names.of(Family::V6).clone()
            ),
            ("flannel.1", "flannel-v6.1")
        );
        for (key, bad) in [
            ("VXLANDeviceName", "eth0"),
            ("VXLANDeviceName", "flannel-v6.1"),
            ("VXLANDeviceName", "flannel.0"),
            ("VXLANDeviceName", "flannel.01"),
            ("VXLANDeviceNameV6", "vxlan.calico"),
            ("VXLANDeviceNameV6", "flannel-v6.16777216"),
        ] {
            let err = c.apply_update(&map(&[(key, bad)])).unwrap_err();
            assert!(err.0.contains(&format!("{key} {bad:?}")), "{err}");
        }
        c.apply_update(&map(&[])).unwrap();
        assert_eq!(c.settings().device_names, DeviceNames::default());
    }

    #[test]
    fn felix_boot_protocol_means_felix_own_and_reserved_ones_are_refused() {
        let mut c = Config::default();
        c.apply_update(&map(&[("DeviceRouteProtocol", "3")]))
            .unwrap();
        assert_eq!(c.settings().route_protocol, 80);
        c.apply_update(&map(&[("DeviceRouteProtocol", "99")]))
            .unwrap();
        assert_eq!(c.settings().route_protocol, 99);
        for reserved in ["0", "1", "2", "4"] {
            let err = c
                .apply_update(&map(&[("DeviceRouteProtocol", reserved)]))
                .unwrap_err();
            assert!(err.0.contains("reserved"), "{err}");
            assert_eq!(
                c.settings().route_protocol,
                99,
                "{reserved} kept the last value"
            );
        }
        for reserved in ["0", "1", "2", "3", "4"] {
            let err = parse_protocol(reserved).unwrap_err();
            assert!(err.contains("reserved"), "{reserved}: {err}");
        }
        assert_eq!(parse_protocol("186"), Ok(186));
        assert!(parse_protocol("256").is_err());
    }

    #[test]
    fn felix_none_is_the_zero_value_of_every_key_read() {
        let mut c = Config::default();
        c.apply_update(&map(&[
            ("VXLANMTU", "1400"),
            ("ExternalNodesCIDRList", "10.1.0.0/16"),
        ]))
        .unwrap();
        c.apply_update(&map(&[
            ("VXLANVNI", "none"),
            ("VXLANPort", "None"),
            ("VXLANMTU", "NONE"),
            ("VXLANMTUV6", "none"),
            ("ExternalNodesCIDRList", "none"),
            ("RouteRefreshInterval", "none"),
        ]))
        .unwrap();
        let s = c.settings();
        assert_eq!(s.vni, 0);
        assert_eq!(s.port, KERNEL_DEFAULT_VXLAN_PORT, "port 0: the kernel's");
        assert_eq!((s.mtu_v4, s.mtu_v6), (None, None), "MTUs automatic");
        assert!(s.external_nodes.is_empty());
        assert_eq!(s.route_refresh_interval, None, "refresh off");
    }

    #[test]
    fn felix_values_in_their_own_syntax() {
        let mut c = Config::default();
        c.apply_update(&map(&[
            ("VXLANPort", "0"),
            ("VXLANMTU", "0"),
            ("ExternalNodesCIDRList", " 10.1.0.0/16 ,fd00::/64,"),
            ("RouteRefreshInterval", "2.5"),
        ]))
        .unwrap();
        let s = c.settings();
        assert_eq!(s.port, KERNEL_DEFAULT_VXLAN_PORT);
        assert_eq!(s.mtu_v4, None);
        let cidrs: Vec<String> = s.external_nodes.iter().map(|n| n.to_string()).collect();
        assert_eq!(cidrs, ["10.1.0.0/16", "fd00::/64"]);
        assert_eq!(s.route_refresh_interval, Some(Duration::from_millis(2500)));
        for (key, bad) in [
            ("VXLANVNI", "nonesuch"),
            ("VXLANPort", "-1"),
            ("VXLANMTU", "none?"),
            ("RouteRefreshInterval", "-3"),
        ] {
            let err = c.apply_update(&map(&[(key, bad)])).unwrap_err();
            assert!(err.0.contains(&format!("{key} {}", quote(bad))), "{err}");
        }
    }

    #[test]
    fn the_flags_read_none_too() {
        assert_eq!(parse_refresh_interval("none"), Ok(None));
        assert_eq!(parse_mtu_v6("none"), Ok(None));
        assert_eq!(parse_vni("none"), Ok(0));
        assert_eq!(parse_cidr_list("none"), Ok(Vec::new()));
    }

    #[test]
    fn keys_no_longer_sent_return_to_defaults() {
        let mut c = Config::default();
        c.apply_update(&map(&[("VXLANVNI", "5000")])).unwrap();
        c.apply_update(&map(&[])).unwrap();
        assert_eq!(c.settings().vni, 4096);
    }
}
